# shardship: every target calls the project venv's own console scripts by path
# (.venv/bin/packer, ...): a different `packer` on PATH cannot interfere, and
# neither can a train.py / packer.py of your own in this folder (which
# `python -m train` would pick up first).
PYTHON_BOOT ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
BIN         := $(VENV)/bin
# This machine has a local CPU wheel for torch 2.13.0; on a GPU cluster set
# TORCH_SPEC= (empty) to keep the CUDA torch you already have.
TORCH_SPEC  ?= torch==2.13.0
RAW         ?= data/raw
OUT         ?= data/packed
CLUSTER     ?=
CLUSTER_OPT := $(if $(CLUSTER),--cluster $(CLUSTER),)
PYTEST_ARGS ?=

.PHONY: install demo test pack slam budget report upload train submit bench lint clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml scripts/install_pillow_simd.sh
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(if $(TORCH_SPEC),$(PY) -m pip install -q "$(TORCH_SPEC)",)
	$(PY) -m pip install -q -e ".[dev]"
	PY=$(PY) sh scripts/install_pillow_simd.sh
	$(BIN)/packer check --pil
	touch $@

demo: install
	PY=$(PY) BIN=$(BIN) sh scripts/demo.sh

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

slam: install
	$(BIN)/packer slam --raw $(RAW)

pack: install
	$(BIN)/packer pack --raw $(RAW) --out $(OUT)

budget: install
	$(BIN)/packer budget --out $(OUT)

report: install
	$(BIN)/packer report --raw $(RAW) --out $(OUT)

upload: install
	$(BIN)/transfer upload $(CLUSTER_OPT) --out $(OUT)

train: install
	$(BIN)/train run --data $(OUT)

submit: install
	$(BIN)/train submit $(CLUSTER_OPT)

bench: install
	$(PY) -m bench

lint: install
	$(BIN)/ruff check
	$(BIN)/mypy shardship packer transfer train

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
