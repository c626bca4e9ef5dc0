# Two commands set up a fresh machine: `make demo` and `make test`.
# `make demo` installs the package alone (no dev tools, no torch, no ray) and leaves its dataset in
# DEMO_DIR for you to look at; `make test` adds the dev extras and the optional torch and ray.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check
BASE_STAMP := $(VENV)/.episodekit-base
TEST_STAMP := $(VENV)/.episodekit-test
DEMO_DIR ?= ./demo-data
DEMO_EPISODES ?= 2500

.PHONY: demo test ci docs lint install clean lerobot-reads

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when pyproject.toml or setup.py (the package discovery) changes.
$(BASE_STAMP): pyproject.toml setup.py | $(BIN)/python
	$(PIP) -e .
	touch $(BASE_STAMP)

$(TEST_STAMP): $(BASE_STAMP)
	$(PIP) -e '.[dev,docs]'
	@# Optional extras for the torch and ray tests: on a machine without them those tests skip.
	-$(PIP) 'torch==2.13.0' || echo "torch not installed: torch tests will skip"
	-$(PIP) 'torchdata>=0.11' || echo "torchdata not installed: StatefulDataLoader tests will skip"
	-$(PIP) 'ray>=2.9' || echo "ray not installed: ray tests will skip"
	-$(PIP) 'av>=14' || echo "PyAV not installed: video tests will skip"
	-$(PIP) 'pillow>=10' || echo "Pillow not installed: image stats tests will skip"
	-$(PIP) 'google-crc32c>=1.5' || echo "google-crc32c not installed: RLDS import tests will skip"
	touch $(TEST_STAMP)

install: $(BASE_STAMP)

demo: $(BASE_STAMP)
	$(BIN)/python scripts/demo.py --root $(DEMO_DIR) --episodes $(DEMO_EPISODES)

# `make test` leaves out the tests marked slow (tests/conftest.py SLOW); `make ci` (what CI runs,
# .ci/run) runs every test. Test datasets are written once per run, shared by the workers.
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not slow" tests
	$(MAKE) --no-print-directory docs

ci: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n 2 tests
	$(MAKE) --no-print-directory docs

# The reference site in ./site (broken links, anchors or API references fail the build).
docs: $(TEST_STAMP)
	$(BIN)/python scripts/apidoc_tree.py > /dev/null
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# LeRobot 0.6.1 reads every import fixture's output (tests/fixtures/import) with the source's
# values: our CLI imports, the formats' own libraries dump the source, LeRobot's venv reads back
# (docs/import.md). Not CI: give LEROBOT_PY, a python with lerobot[dataset]==0.6.1, and TFDS_PY
# a python with tensorflow-datasets (for the RLDS fixture's values; default LEROBOT_PY).
lerobot-reads: $(TEST_STAMP)
	@test -n "$(LEROBOT_PY)" || { echo "give LEROBOT_PY=<LeRobot 0.6.1's venv python>"; exit 2; }
	$(BIN)/python scripts/check_lerobot_reads.py all --lerobot-python $(LEROBOT_PY) \
		$(if $(TFDS_PY),--tfds-python $(TFDS_PY))

# Everything `make`, `make demo` and `make test` wrote: the venv, build and test caches, the demo
# dataset, and the demo's frame store under ~/.cache/episodekit/frames (found before the venv goes).
clean:
	-@if [ -x $(BIN)/python ] && [ -f $(DEMO_DIR)/meta/info.json ]; then \
		$(BIN)/python -c "import shutil, sys; \
	from episodekit.core.dataset import open_dataset; \
	from episodekit.core.store import default_store_dir; \
	d = default_store_dir(open_dataset(sys.argv[1])); \
	print('removing the demo frame store', d) if d.exists() else None; \
	shutil.rmtree(d, ignore_errors=True)" $(DEMO_DIR); fi
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .ruff_cache .hypothesis $(DEMO_DIR)
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
