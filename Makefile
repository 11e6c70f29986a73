# `make demo` and `make test` each create .venv when it is missing and install what they need
# from the committed locks in requirements/ (hashes checked; `make lock` regenerates them).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
# Two install routes. Where torch's CPU build (2.13.0+cpu) lies as a wheel in WHEELS (this
# project's machines), the locks run.txt/dev.txt install it, PyPI the rest; elsewhere the
# PyPI-route locks run-pypi.txt/dev-pypi.txt install PyPI's torch 2.13.0 for Linux (the CUDA
# build, with triton and the nvidia-* libraries; it runs on a CPU too). `make route` says which.
WHEELS ?= /opt/wheels
TORCH_WHEEL := $(wildcard $(WHEELS)/torch-2.13.0+cpu-*.whl)
ifneq ($(TORCH_WHEEL),)
ROUTE := wheel directory $(WHEELS) (torch 2.13.0+cpu, no CUDA libraries)
UV_SOURCES := --find-links $(WHEELS)
LOCK_SUFFIX :=
else
ROUTE := PyPI only (no torch-2.13.0+cpu wheel in $(WHEELS)): torch 2.13.0 with CUDA libraries
UV_SOURCES :=
LOCK_SUFFIX := -pypi
endif
RUN_LOCK := requirements/run$(LOCK_SUFFIX).txt
DEV_LOCK := requirements/dev$(LOCK_SUFFIX).txt
LOCK_FLAGS := --generate-hashes --python-version 3.11 -c requirements/constraints.in --find-links $(WHEELS)
PYPI_FLAGS := --generate-hashes --python-version 3.11 -c requirements/constraints-pypi.in
# The locked packages, then attnkit itself (editable, no dependencies, no build isolation).
define install_lock
	@echo "install route: $(ROUTE); lock $(1)"
	$(UV) pip sync --python $(BIN)/python --require-hashes $(UV_SOURCES) $(1)
	$(UV) pip install --python $(BIN)/python --no-deps --no-build-isolation -e .
endef

.PHONY: demo test lint bench clean lock route

route:
	@echo "install route: $(ROUTE); locks $(RUN_LOCK), $(DEV_LOCK)"

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(UV): requirements/uv.txt | $(BIN)/python
	$(BIN)/python -m pip install -q --require-hashes -r requirements/uv.txt
	touch $@

$(STAMP_RUN): $(RUN_LOCK) pyproject.toml | $(UV)
	$(call install_lock,$(RUN_LOCK))
	rm -f $(STAMP_DEV)
	touch $@

$(STAMP_DEV): $(DEV_LOCK) pyproject.toml | $(UV)
	$(call install_lock,$(DEV_LOCK))
	touch $@ $(STAMP_RUN)

# Regenerate the locks from pyproject.toml's ranges (newest releases that fit; see README).
lock: | $(UV)
	$(UV) pip compile requirements/uv.in --generate-hashes -o requirements/uv.txt
	$(UV) pip compile pyproject.toml requirements/build.in --extra model --excludes requirements/run-excludes.in $(LOCK_FLAGS) -o requirements/run.txt
	$(UV) pip compile pyproject.toml requirements/build.in --extra hf $(LOCK_FLAGS) -o requirements/hf.txt
	$(UV) pip compile pyproject.toml requirements/build.in --extra dev --extra model --extra hf $(LOCK_FLAGS) -o requirements/dev.txt
	# the PyPI route: the same pins but PyPI's torch 2.13.0 (and what it pulls in)
	for x in run dev; do grep -E '^[A-Za-z0-9]' requirements/$$x.txt | sed 's/ \\$$//' \
		| grep -v '^torch==' > $(VENV)/pins-$$x.txt; done
	$(UV) pip compile pyproject.toml requirements/build.in --extra model --excludes requirements/run-excludes.in $(PYPI_FLAGS) -c $(VENV)/pins-run.txt -o requirements/run-pypi.txt
	$(UV) pip compile pyproject.toml requirements/build.in --extra dev --extra model --extra hf $(PYPI_FLAGS) -c $(VENV)/pins-dev.txt -o requirements/dev-pypi.txt

demo: $(STAMP_RUN)
	$(BIN)/attnkit explain
	$(BIN)/attnkit explain "The animal didn't cross the street because it was too tired" --model default --word it

lint: $(STAMP_DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	sh scripts/install-browser.sh
	$(BIN)/python -m pytest -q
	$(MAKE) --no-print-directory test-portable

# The kernel and policy tests again as on another CPU: torch's AVX2 kernels instead of the best
# this CPU has, numba's kernels compiled for a generic x86-64 (kept in their own cache directory),
# and torch.compile's kernels in a cache of their own: torch 2.13's inductor reuses kernels
# compiled under the default capability and then computes wrong results (compiled Flex: relative
# error 0.8 against float64; a fresh cache gives the right ones).
PORTABLE_ENV := ATEN_CPU_CAPABILITY=avx2 NUMBA_CPU_NAME=generic \
	TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/$(VENV)/torchinductor-avx2
.PHONY: test-portable
test-portable: $(STAMP_DEV)
	@$(PORTABLE_ENV) $(BIN)/python -c "import torch; print('portable run: torch capability', \
		torch.backends.cpu.get_cpu_capability() + ', numba CPU generic: tests/kernels')"
	$(PORTABLE_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider tests/kernels

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
	ATTNKIT_LONG=1 $(BIN)/python -m pytest -q tests/train/data/test_window.py -k long_context

# Row lengths of --pack on the eng-fra bench row: how the default row length was chosen (~3 min).
.PHONY: pack-lengths
pack-lengths: $(STAMP_RUN)
	cd benchmarks && ../$(BIN)/python bench_train.py --child pack-lengths --arg 16,32,64,128,256,512

# The documentation site (guides in docs/, API pages from the docstrings) in site/, offline;
# --strict: a broken link or reference fails. Open site/index.html (search needs a server:
# python -m http.server -d site).
.PHONY: docs
docs: $(STAMP_DEV)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# tests/integrations against the oldest allowed and the newest transformers, and tests/kernels and
# the functional tests against the oldest allowed and the newest torch, in throwaway venvs
# (scripts/compat.py --dry-run prints the plan).
.PHONY: compat
compat: $(STAMP_DEV)
	WHEELS=$(WHEELS) $(BIN)/python scripts/compat.py

# The transformers guide's list of architectures, rewritten from the tiny models that match eager.
.PHONY: readme-hf
readme-hf: $(STAMP_DEV)
	ATTNKIT_WRITE_README=1 $(BIN)/python -m pytest -q tests/integrations/test_architectures_readme.py

bench: $(STAMP_RUN)
	$(BIN)/attnkit bench

# The same rows on a loaded memory bus: a second process copies memory in a loop on the other core
# (issue 32's "busy host"); the record notes the copier's bandwidth. ROWS=... narrows it.
.PHONY: bench-loaded
bench-loaded: $(STAMP_RUN)
	$(BIN)/attnkit bench --contend $(if $(ROWS),--only '$(ROWS)')

# On a machine with a CUDA build of torch (any version): the CUDA tests and the GPU bench rows in
# a venv on that torch (--system-site-packages, attnkit --no-deps), one table at the end.
# GPU_PYTHON: the interpreter whose torch sees the GPU.
GPU_PYTHON ?= $(PY)
.PHONY: gpu-check gpu-wheels
gpu-check:
	$(GPU_PYTHON) scripts/gpu_check.py --python $(GPU_PYTHON)

# Run here, before lending the checkout to a GPU machine without a package index: the wheels
# gpu-check installs there (--no-deps) beside its system packages: platformdirs, and the oldest
# transformers attnkit's integration accepts (the machine's own may be older).
gpu-wheels: $(STAMP_DEV)
	$(BIN)/python -m pip download -q --no-deps -d gpu-wheels platformdirs \
		"transformers==$$($(BIN)/python -c 'from attnkit.integrations.versions import TRANSFORMERS_OLDEST as v; print(v)')"
	ls gpu-wheels

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site

# Language model on tiny Shakespeare (../shared/data): attnkit against a plain-PyTorch GPT with
# nanoGPT's CPU recipe, side by side, one thread each (~2 x 150 s idle, then the best recipe in
# the peer's time); and attnkit's best recipe (4,000 steps) with its loss curve and a sample.
.PHONY: lm-bench lm-shakespeare
lm-bench: $(STAMP_RUN)
	cd benchmarks && ../$(BIN)/python lm_race.py --bf16

lm-shakespeare: $(STAMP_RUN)
	$(BIN)/python scripts/lm_shakespeare.py

# The GPU race: nanoGPT's train_shakespeare_char recipe (compiled, bf16, 5,000 steps) on the
# plain-PyTorch peer and on attnkit train, one after the other on one GPU (under 6 minutes on an
# H100-class GPU). Needs a CUDA torch: without the wheel directory make installs PyPI's (the CUDA
# build); in a venv that has one, run benchmarks/lm_race_gpu.py directly.
.PHONY: lm-bench-gpu
lm-bench-gpu: $(STAMP_RUN)
	cd benchmarks && ../$(BIN)/python lm_race_gpu.py --device cuda
