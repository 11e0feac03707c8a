# Quick start:  make demo   (install + embedded broker + worker + web console + Reuters R8 streaming through)
#               make test   (install the test extras + run the suite, about 6 minutes on 2 cores)
#               make test-long   (the long fault-injection end-to-end checks, about 4 minutes; CI runs both)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO_ARGS ?=
PYTEST_ARGS ?=
# test processes (pytest-xdist): the end-to-end tests mostly wait on their broker and worker processes,
# so two halve the wall time on 2 cores; PYTEST_WORKERS=0 runs everything in one process
PYTEST_WORKERS ?= 2

.PHONY: demo test test-long install-demo install-test lint results results-check clean mutation

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# editable installs, redone only when pyproject.toml changes (its dependencies and entry points; the code itself
# is read from the checkout): a stamp file per extra set
install-demo: $(VENV)/.installed-demo
install-test: $(VENV)/.installed-test

$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[demo,console]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,console]'
	touch $@

demo: install-demo
	$(BIN)/streamsemi demo $(DEMO_ARGS)

test: install-test
	$(BIN)/python -m pytest -m "not long" -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-long: install-test
	$(BIN)/python -m pytest -m long -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

lint: install-test
	$(BIN)/ruff check .

# docs/results.md from the records it names (benchmarks/results/page_full/ and the served-quality, suggestion and
# discovery records of streamsemi/evaluation/results_page.py); runs nothing. `make results-check`: exit 1 if it differs
results: install-test
	$(BIN)/python -m streamsemi.evaluation.results_page --from-records --out docs/results.md

results-check: install-test
	$(BIN)/python -m streamsemi.evaluation.results_page --check --out docs/results.md

# Mutation testing on demand (not in CI): mutmut on the core modules of [tool.mutmut] in pyproject.toml,
# run on a copy of the committed tree (HEAD) with one worker process; results in benchmarks/results/mutation*.
# MUTANTS='streamsemi.core.messages*' limits the run to one module (mutmut's name patterns).
MUTATION_DIR ?= /tmp/streamsemi-mutation
MUTANTS ?=
mutation: install-test
	$(BIN)/python -m pip install -q 'mutmut>=3.3,<4'
	rm -rf $(MUTATION_DIR) && mkdir -p $(MUTATION_DIR) && git archive HEAD | tar -x -C $(MUTATION_DIR)
	cd $(MUTATION_DIR) && OMP_NUM_THREADS=1 $(abspath $(BIN))/mutmut run --max-children 1 $(MUTANTS)
	$(BIN)/python benchmarks/mutation_report.py $(MUTATION_DIR)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
