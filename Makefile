# slim_fairseq: `make demo` (set up, train, translate, score) and `make test` (set up, run pytest).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
STAMP  := $(VENV)/.slim-setup-done
# e.g. https://download.pytorch.org/whl/cpu: where torch comes from, where pip would otherwise
# find only PyPI's Linux wheel, which is the CUDA build
TORCH_INDEX ?=

.PHONY: setup test test-fast demo gpu-check clean

setup: $(STAMP)

# torch first and pinned (an unpinned torch pulls CUDA); an existing torch in the venv (e.g. a
# CUDA build) is kept. fairseq comes from the ve-fairseq wheel without its torchaudio requirement.
$(STAMP): constraints.txt requirements.txt setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || { echo "[setup] installing torch==2.13.0"; $(PIP) install -c constraints.txt $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch==2.13.0; }
	@$(PY) -c "import fairseq" 2>/dev/null || { echo "[setup] installing ve-fairseq (prebuilt fairseq for Python 3.11)"; $(PIP) install --no-deps -c constraints.txt ve-fairseq; }
	@echo "[setup] installing requirements"; $(PIP) install -c constraints.txt -r requirements.txt
	@$(PIP) install --no-deps --no-build-isolation -e .
	@$(PY) -c "import fairseq, torch, numpy; print('[setup] ok: torch', torch.__version__, 'fairseq', fairseq.__version__, 'numpy', numpy.__version__)" 2>/dev/null
	@touch $(STAMP)

test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:warnings -p no:cacheprovider -n 2 --dist worksteal tests

test-fast: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:warnings -m "not slow" tests

demo: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

# the device check on one CUDA GPU, within its own time budget (docs/GPU.md)
gpu-check: setup
	$(PY) scripts/gpu_check.py --out results/gpu-check

clean:
	rm -rf build results
