# Neo: `make train` and `make test` set up what is missing first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-stamp
# GPU=1 forces the CUDA builds; by default they are used when nvidia-smi is present.
GPU ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1 || echo 0)

TORCH_VERSION := 2.13.0
TORCHREC_VERSION := 1.8.0
FBGEMM_VERSION := 1.8.0
# torchrec's own requirements besides fbgemm-gpu (installed explicitly: torchrec goes in with --no-deps)
TORCHREC_DEPS := tensordict torchmetrics==1.0.3 tqdm pyre-extensions iopath

# On CPU, torchrec's metadata requires the CUDA fbgemm-gpu wheel, which cannot load beside a CPU
# torch: setup installs the CPU build of FBGEMM, then torchrec with --no-deps, then torchrec's
# other requirements. pip's complaint that fbgemm-gpu is missing is expected and filtered; the
# import check at the end of setup catches anything really missing.
QUIET := 2>&1 | grep -v "requires fbgemm-gpu, which is not installed\|dependency resolver does not\|dependency conflicts\|^WARNING: Location" || true

.PHONY: setup train test test-fast lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "setting up $(VENV) (GPU=$(GPU))"
ifeq ($(GPU),1)
	$(PIP) install -q torch==$(TORCH_VERSION) fbgemm-gpu==$(FBGEMM_VERSION) torchrec==$(TORCHREC_VERSION) $(QUIET)
else
	$(PIP) install -q torch==$(TORCH_VERSION) fbgemm-gpu-cpu==$(FBGEMM_VERSION) $(QUIET)
	$(PIP) install -q --no-deps torchrec==$(TORCHREC_VERSION) $(QUIET)
endif
	$(PIP) install -q $(TORCHREC_DEPS) $(QUIET)
	$(PIP) install -q -e '.[dev]' $(QUIET)
	$(PY) -c "import torch, torchrec, fbgemm_gpu, lightning, hydra, pluggy, neo_core, neo_plugins" 
	@touch $(STAMP)

train: setup
	$(PY) recipes/train.py $(ARGS)

test: setup
	$(PY) -m pytest -q $(ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow" $(ARGS)

lint: setup
	$(VENV)/bin/ruff check neo_core plugins recipes tests bench

bench: setup
	$(PY) bench/planner.py $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun lightning_logs .pytest_cache
