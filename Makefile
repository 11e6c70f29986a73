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
	sh scripts/install-browser.sh
	$(BIN)/python -m pytest -q

# The property-based suite at length: 20,000 random examples in total (tests/fuzz/profiles.py
# divides them among the tests); failures are saved in .hypothesis/ and replayed first next time.
.PHONY: fuzz
fuzz: $(STAMP_DEV)
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q --hypothesis-show-statistics tests/fuzz

# Acceptance runs for training (minutes each; numbers in the README).
.PHONY: accept accept-copy accept-translate accept-lm
accept: $(STAMP_RUN)
	$(BIN)/python scripts/accept.py all
accept-copy accept-translate accept-lm: $(STAMP_RUN)
	$(BIN)/python scripts/accept.py $(@:accept-%=%)

# Long-context smoke run: the windowed lm trained at --max-len 16384 (~15 s, checks peak memory).
.PHONY: long
long: $(STAMP_DEV)
	ATTNKIT_LONG=1 $(BIN)/python -m pytest -q tests/train/test_window.py -k long_context

# Row lengths of --pack on the eng-fra bench row: how the default row length was chosen (~3 min).
.PHONY: pack-lengths
pack-lengths: $(STAMP_RUN)
	cd benchmarks && ../$(BIN)/python bench_train.py --child pack-lengths --arg 16,32,64,128,256,512

bench: $(STAMP_RUN)
	$(BIN)/attnkit bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# Language model on tiny Shakespeare (../shared/data): attnkit against a plain-PyTorch GPT with
# nanoGPT's CPU recipe, side by side, one thread each (~2 x 150 s idle, then the best recipe in
# the peer's time); and attnkit's best recipe (4,000 steps) with its loss curve and a sample.
.PHONY: lm-bench lm-shakespeare
lm-bench: $(STAMP_RUN)
	cd benchmarks && ../$(BIN)/python lm_race.py --bf16

lm-shakespeare: $(STAMP_RUN)
	$(BIN)/python scripts/lm_shakespeare.py
