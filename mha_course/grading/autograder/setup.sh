#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (see run_autograder).
set -euo pipefail
cd "$(dirname "$0")"
VENV="${MHA_COURSE_AUTOGRADER_ROOT:-/autograder}/venv"
PYTHON=""
for candidate in python3.13 python3.12 python3.11 python3; do  # the first that runs and is 3.11 or later
  if "$candidate" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then PYTHON="$candidate"; break; fi
done
PYTHON="${PYTHON:-python3.11}"  # none: Ubuntu 22.04, whose Python is 3.10; install 3.11 (and venv where missing)
"$PYTHON" -m venv "$VENV" 2>/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
  "$PYTHON" "$PYTHON-venv" && "$PYTHON" -m venv "$VENV"; }
# The course with what grading needs (its grading extra), at the versions requirements.txt pins. PyTorch's CPU
# index is added to this one command, after the indexes the image sets: from the usual index, torch on Linux is
# the CUDA build, gigabytes that grading, on the CPU, never uses.
"$VENV/bin/python" -m pip install --disable-pip-version-check \
  --extra-index-url https://download.pytorch.org/whl/cpu -c requirements.txt "./course[grading]"
