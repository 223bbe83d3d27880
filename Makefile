# The two commands of the README. Both build .venv on first use and reinstall only when
# pyproject.toml or constraints.txt changed (the stamp file is older than them).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint fmt venv bench clean chromium

venv: $(STAMP) chromium

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "verimail needs Python 3.11, found " + sys.version' 
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# make demo PORT=8080 serves the API on another port (default 8000).
PORT ?= 8000
demo: $(STAMP)
	$(BIN)/verimail demo --port $(PORT)

test: $(STAMP) chromium
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# pytest exits 5 when it collected nothing: that is a broken suite, say so and fail.
	$(BIN)/python -m pytest; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: the suite is broken" >&2; fi; \
	  exit $$rc

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
