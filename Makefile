# shardship: every target calls `python -m ...` from the project venv so that a
# different `packer` on PATH cannot interfere.
PYTHON_BOOT ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
# This machine has a local CPU wheel for torch 2.13.0; on a GPU cluster set
# TORCH_SPEC= (empty) to keep the CUDA torch you already have.
TORCH_SPEC  ?= torch==2.13.0
RAW         ?= data/raw
OUT         ?= data/packed
CLUSTER     ?=
CLUSTER_OPT := $(if $(CLUSTER),--cluster $(CLUSTER),)
PYTEST_ARGS ?=

.PHONY: install demo test pack slam budget upload train submit bench lint clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml scripts/install_pillow_simd.sh
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(if $(TORCH_SPEC),$(PY) -m pip install -q "$(TORCH_SPEC)",)
	$(PY) -m pip install -q -e ".[dev]"
	PY=$(PY) sh scripts/install_pillow_simd.sh
	$(PY) -m packer check --pil
	touch $@

demo: install
	PY=$(PY) sh scripts/demo.sh

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

slam: install
	$(PY) -m packer slam --raw $(RAW)

pack: install
	$(PY) -m packer pack --raw $(RAW) --out $(OUT)

budget: install
	$(PY) -m packer budget --out $(OUT)

upload: install
	$(PY) -m transfer upload $(CLUSTER_OPT) --out $(OUT)

train: install
	$(PY) -m train run --data $(OUT)

submit: install
	$(PY) -m train submit $(CLUSTER_OPT)

bench: install
	$(PY) -m bench

lint: install
	$(PY) -m compileall -q packer transfer train bench tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
