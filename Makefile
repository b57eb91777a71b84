# The course's two commands:
#   make book   build the HTML book into _build/html (creates .venv and installs everything on first use)
#   make test   run every test: the book build (warnings are errors), package tests, strict nbval on every chapter
# Needs only Python 3.11+ and make.

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

# The same book without solutions: built from the student edition of the chapters.
book-student: $(STAMP)
	$(BIN)/python -m mha_course student --book --force --out _build/student-book
	$(BIN)/jupyter-book build _build/student-book -W -n --keep-going
	@echo "The book without solutions is in _build/student-book/_build/html: open book/intro.html there."

test: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going
	$(BIN)/python -m pytest

clean:
	rm -rf _build
