# Quick start:  make demo   (install + embedded broker + worker + Reuters R8 streaming through)
#               make test   (install the test extras + run the whole suite)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: demo test install-demo install-test lint results clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

install-demo: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[demo]'

install-test: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'

demo: install-demo
	$(BIN)/streamsemi demo $(DEMO_ARGS)

test: install-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install-test
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
