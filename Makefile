# The two commands a newcomer needs: `make demo` and `make test`. Each sets up what is missing first.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed first, as TORCH_SPEC (point it at your CUDA build on a GPU box), so that nothing
# later lets pip choose another torch build
TORCH_SPEC ?= torch==2.13.0
export TORCH_SPEC
PYTEST_ARGS ?=
# pytest-xdist workers of `make test`, each taking whole files (TEST_WORKERS=0: one process)
TEST_WORKERS ?= 2
# The SGLang release whose own code tests/contract and the SGLang stand-in run (setup.cfg's `gpu` extra admits
# the releases guirl was checked against); xgrammar at the version that release pins
SGLANG_VERSION ?= 0.5.23
XGRAMMAR_VERSION ?= 0.2.7

.PHONY: demo demo-rl demo-eval test setup setup-test bench lint clean

# the `osworld` extra: the shipped suite's tasks are scored by OSWorld's metrics (images, Chrome's pages)
$(VENV)/.stamp-runtime: setup.cfg pyproject.toml scripts/bootstrap.sh scripts/system-packages.txt
	scripts/bootstrap.sh "$(PYTHON)" "$(VENV)"
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check -e '.[osworld]'
	touch $@

# Tests also run SGLang's own code (tests/contract, the SGLang stand-in): its wheel (Python, plus Rust
# extensions it loads lazily) and xgrammar go in without their dependencies, which pin CUDA builds of torch,
# triton and GPU kernels; then the light packages their modules import
$(VENV)/.stamp-test: $(VENV)/.stamp-runtime setup.cfg scripts/test-system-packages.txt scripts/sglang-test-requirements.txt
	scripts/bootstrap.sh "$(PYTHON)" "$(VENV)" scripts/test-system-packages.txt
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,osworld]'
	$(PY) -m pip install -q --disable-pip-version-check --no-deps desktop-env==1.0.2
	$(PY) -m pip install -q --disable-pip-version-check --no-deps sglang==$(SGLANG_VERSION) xgrammar==$(XGRAMMAR_VERSION)
	$(PY) -m pip install -q --disable-pip-version-check -r scripts/sglang-test-requirements.txt
	touch $@

setup: $(VENV)/.stamp-runtime

setup-test: $(VENV)/.stamp-test

# Learning on local desktops (`guirl learn`): a generated suite of click tasks, a warm start by behaviour
# cloning, GRPO with the held-out success curve, its plot (evaluation-only mode: `make demo-eval`; RL on the
# shipped OSWorld-style tasks: `make demo-rl`; the actor runtime's transport demo: `guirl demo`)
demo: setup
	$(VENV)/bin/guirl learn --config configs/desktop_learning.toml --test-tasks 32 \
		--set train.updates=12 --set train.eval_every=4 $(ARGS)

demo-rl: setup
	$(VENV)/bin/guirl train --config configs/local_rl.toml $(ARGS)

demo-eval: setup
	$(VENV)/bin/guirl eval --config configs/local_eval.toml $(ARGS)

test: setup-test
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

bench: setup-test
	$(PY) bench/transport.py
	$(PY) bench/broker.py

lint: setup-test
	$(VENV)/bin/ruff check guirl bench tests

clean:
	rm -rf $(VENV) runs .pytest_cache build *.egg-info
