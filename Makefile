# `make demo` and `make test` each create .venv when it is missing and install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[model]"
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@ $(STAMP_RUN)

demo: $(STAMP_RUN)
	$(BIN)/attnkit explain
	$(BIN)/attnkit explain "The animal didn't cross the street because it was too tired" --model default --word it

lint: $(STAMP_DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q

bench: $(STAMP_RUN)
	$(BIN)/attnkit bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
