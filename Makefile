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

.PHONY: demo demo-eval test setup setup-test bench lint clean

$(VENV)/.stamp-runtime: setup.cfg pyproject.toml scripts/bootstrap.sh scripts/system-packages.txt
	scripts/bootstrap.sh "$(PYTHON)" "$(VENV)"
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check -e .
	touch $@

$(VENV)/.stamp-test: $(VENV)/.stamp-runtime scripts/test-system-packages.txt
	scripts/bootstrap.sh "$(PYTHON)" "$(VENV)" scripts/test-system-packages.txt
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	$(PY) -m pip install -q --disable-pip-version-check --no-deps desktop-env==1.0.2
	touch $@

setup: $(VENV)/.stamp-runtime

setup-test: $(VENV)/.stamp-test

# RL mode on this machine: a few GRPO updates of the tiny model on the local training tasks, on local
# desktops (evaluation-only mode: `make demo-eval`; the actor runtime's transport demo: `guirl demo`)
demo: setup
	$(VENV)/bin/guirl train --config configs/local_rl.toml $(ARGS)

demo-eval: setup
	$(VENV)/bin/guirl eval --config configs/local_eval.toml $(ARGS)

test: setup-test
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup-test
	$(PY) bench/transport.py
	$(PY) bench/broker.py

lint: setup-test
	$(VENV)/bin/ruff check guirl bench tests

clean:
	rm -rf $(VENV) runs .pytest_cache build *.egg-info
