# Two commands set up a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.episodekit-installed
DEMO_DIR ?= $(shell mktemp -d -t episodekit-demo-XXXXXX)
DEMO_EPISODES ?= 2500

.PHONY: demo test lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Reinstall only when pyproject.toml changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	@# Optional extras for the torch and ray tests: on a machine without them those tests skip.
	-$(BIN)/pip install -q 'torch==2.13.0' || echo "torch not installed: torch tests will skip"
	-$(BIN)/pip install -q 'ray>=2.9' || echo "ray not installed: ray tests will skip"
	-$(BIN)/pip install -q 'av>=14' || echo "PyAV not installed: video tests will skip"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py --root $(DEMO_DIR)/sample --episodes $(DEMO_EPISODES)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 tests

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
