# The two commands of the README. Both build .venv on first use and reinstall only when
# pyproject.toml or constraints.txt changed (the stamp file is older than them).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

PYTEST_WORKERS ?= -n 3 --dist loadfile

.PHONY: demo test test-under-load test-hostile-env lint fmt venv bench clean chromium

venv: $(STAMP) chromium

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "verimail needs Python 3.11, found " + sys.version' 
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# setuptools says "Editable installation." (an InformationOnly notice) for every editable
	@# install of a mapped package; the log is kept, and shown whole when the install fails.
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]' > $(VENV)/install.log 2>&1 \
	  || { cat $(VENV)/install.log; exit 1; }
	touch $(STAMP)

# make demo PORT=8080 serves the API on another port (default 8000).
PORT ?= 8000
demo: $(STAMP)
	$(BIN)/verimail demo --port $(PORT)

test: $(STAMP) chromium
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# pytest exits 5 when it collected nothing: that is a broken suite, say so and fail.
	@# Three workers, a file each at a time: the suite mostly waits on sockets and child
	@# processes, so even on two cores a third worker still shortens it (477 s against
	@# 537-568 s with two; docs/development.md, "Testing").
	@# As a fresh machine may run it: COLUMNS=60, so every test that reads Rich output sees
	@# a narrow terminal (a box wrapped at the width once split a message a test looked for),
	@# and a temporary folder whose path is over 100 characters long.
	mkdir -p $(HOSTILE_TMP)
	TMPDIR=$(HOSTILE_TMP) COLUMNS=60 $(BIN)/python -m pytest $(PYTEST_WORKERS) --durations=25; \
	  rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests: the suite is broken" >&2; fi; \
	  exit $$rc

# make test beside a busy loop on every core (issue 48: no test's outcome may depend on the
# machine's speed). Each loop spins on "is the recipe's shell still there?" and ends when
# it is gone, however it ended (even killed outright); the shell kills them too when the
# suite ends, whatever its outcome, or on a signal. The target fails when the suite does.
# LOAD_LOOPS sets how many loops (default: one per core).
LOAD_LOOPS ?= $(shell nproc)
test-under-load: $(STAMP) chromium
	@shell=$$$$; loops=; \
	  for i in $$(seq $(LOAD_LOOPS)); do \
	    ( while kill -0 $$shell 2>/dev/null; do :; done ) & loops="$$loops $$!"; \
	  done; \
	  trap 'kill $$loops 2>/dev/null' EXIT; \
	  trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 141' PIPE; trap 'exit 143' TERM; \
	  echo "$(LOAD_LOOPS) busy loops beside the suite:$$loops"; \
	  started=$$(date +%s); \
	  $(MAKE) --no-print-directory test; rc=$$?; \
	  echo "make test under load: exit $$rc after $$(( $$(date +%s) - started )) s"; \
	  exit $$rc

# The whole suite runs in HOSTILE_TMP (above). Running the tests that read command output a
# second time there, after a suite in /tmp, cost a minute of every make test; test-hostile-env
# runs just them, for a quick look.
HOSTILE_TMP := $(or $(TMPDIR),/tmp)/verimail-hostile-env/a-temporary-folder-whose-path-is-longer-than-one-hundred-characters
HOSTILE_TESTS := tests/test_cli_errors.py tests/test_cli_verify.py tests/test_cli_jobs.py \
  tests/test_store_cli.py tests/test_fresh_machine.py
test-hostile-env: $(STAMP)
	mkdir -p $(HOSTILE_TMP)
	TMPDIR=$(HOSTILE_TMP) COLUMNS=60 $(BIN)/python -m pytest $(PYTEST_WORKERS) -p no:cacheprovider $(HOSTILE_TESTS)

# The dashboard's browser test drives Debian's chromium (Playwright never downloads a
# browser here). Installed when missing and apt is there, as root or with password-less
# sudo; where it cannot be, that test skips and says why.
CHROMIUM := /usr/bin/chromium
chromium:
	@if [ ! -x $(CHROMIUM) ] && command -v apt-get >/dev/null 2>&1; then \
	  if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	  { $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; } \
	  || echo "chromium could not be installed; the browser test will skip" >&2; \
	fi

# The dashboard pictures in docs/images/: the browser test's walkthrough, writing them.
.PHONY: screenshots
screenshots: $(STAMP) chromium
	VERIMAIL_DOC_SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/test_dashboard_browser.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/python -m bench.run_all  # every benchmark at default size (~6–7 min); see BENCHMARKS.md

clean:
	rm -rf $(VENV) .verimail .pytest_cache .ruff_cache
