# Sluice developer entry points. Everything installs into .venv from this
# repository's own files; nothing is assumed to be on the machine but
# python3 (3.11+) and, for the ledger tests, Postgres and Redis on localhost.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
MODEL_DIR := .sluice/models/tiny-llama
# A 2-layer model with the same tokenizer: the fallback version in the
# overload and routing tests.
SMALL_MODEL_DIR := .sluice/models/tiny-llama-small

# Every distribution in the repo, installed editable into one dev venv.
# (Each one is installable on its own with only its own dependencies.)
PACKAGES := libs/outcomes libs/admission libs/telemetry libs/rpc libs/config libs/tokenization libs/engine libs/placement libs/sim libs/limits libs/ledger libs/top libs/rollout \
            libs/kernels libs/model libs/tinymodel libs/devstack \
            services/gateway services/router services/scheduler services/replica
PYPROJECTS := $(addsuffix /pyproject.toml,$(PACKAGES))
# The native CPU kernels are compiled at install: rebuild when their sources change.
NATIVE := libs/kernels/setup.py $(wildcard libs/kernels/src/sluice/kernels/_*.c libs/kernels/src/sluice/kernels/_*.h)

.PHONY: install model run test test-unit protos check-protos bench clean observability-tools observe

$(VENV)/.installed: $(PYPROJECTS) $(NATIVE) requirements-dev.txt constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U "pip>=24" "setuptools>=68" wheel
	# The CPU build; an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -c constraints.txt --no-build-isolation \
		$(addprefix -e ,$(PACKAGES)) -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

$(MODEL_DIR)/config.json: | $(VENV)/.installed
	$(PY) -m sluice.tinymodel $(MODEL_DIR)

$(SMALL_MODEL_DIR)/config.json: | $(VENV)/.installed
	$(PY) -m sluice.tinymodel $(SMALL_MODEL_DIR) --layers 2 --seed 1

model: $(MODEL_DIR)/config.json $(SMALL_MODEL_DIR)/config.json

# `make run CATALOG=two-versions [WEIGHTS=90,10]`: the alias tiny-llama
# served by tiny-llama-v1 (MODEL_DIR) and tiny-llama-v2 (SMALL_MODEL_DIR),
# one replica each, weights editable live in .sluice/catalog.json.
CATALOG ?= one-version
WEIGHTS ?= 90,10
run: install model
	$(PY) -m sluice.devstack --model-dir $(MODEL_DIR) --catalog $(CATALOG) \
		--small-model-dir $(SMALL_MODEL_DIR) --weights $(WEIGHTS)

# promtool (rule checks and unit tests) and prometheus (the scrape test and
# `make observe`) come from Debian's prometheus package. CI runs as root on
# Debian; without apt-get this fails loudly rather than skipping the tests.
# Installing it starts no server where systemd is not running (containers).
observability-tools:
	@if command -v promtool >/dev/null && command -v prometheus >/dev/null; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then \
		echo "promtool/prometheus missing and no apt-get: install Prometheus 2.x (it ships promtool)" >&2; exit 1; fi; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
		|| { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }

# A local Prometheus on :9090 scraping a running `make run` stack and
# evaluating the chart's rules; Grafana: see README, Observability.
observe: install observability-tools
	$(PY) deploy/observability/prometheus_local.py

test: install model observability-tools
	$(PY) scripts/gen_protos.py --check
	$(PY) -m pytest

test-unit: install model
	$(PY) -m pytest tests/unit

protos: install
	$(PY) scripts/gen_protos.py

check-protos: install
	$(PY) scripts/gen_protos.py --check

# Each benchmark prints a ratio measured side by side in one run; the
# whole-stack comparison with vLLM needs the peer env (bench/peer_stack_vs_vllm.py).
bench: install model
	@for script in bench/bench_*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) .sluice .pytest_cache .hypothesis
