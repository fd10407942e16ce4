# DynamICCL — every target sets up what it needs (virtualenv, plugin, tools).
# Heavy downloads and builds are cached in $(DYNAMICCL_CACHE).
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

export DYNAMICCL_CACHE ?= $(HOME)/.cache/dynamiccl/v1
PY := .venv/bin/python
PYTEST := $(PY) -m pytest
# Runs `make -C plugin test` (C tests, exports, fuzz, glibc-2.17 and aarch64 builds) and checks its output.
PLUGIN_BUILD_TEST := tests/unit/plugin/test_plugin_build.py::test_plugin_make_test_passes

.PHONY: help venv demo test lint unit integration e2e plugin plugin-test gpu-test fuzz tools \
        cluster-up cluster-down crds bench demo-cluster clean images real lane-cpu lane-cluster

help: ## List the targets, one line each
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z0-9_-]+:.*## /{printf "  \033[1m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

venv: ## Create .venv (cached heavy deps + dynamiccl editable)
	@bash hack/venv.sh

demo: venv plugin ## Run the whole loop on a simulated cluster (no cluster, no GPU)
	@.venv/bin/dynamiccl demo

test: venv plugin ## Everything CI runs, in two lanes at once: (lint, plugin-test, unit) uses the CPU, (tools, integration, e2e, real) mostly waits on the cluster; each lane's output is printed when it ends (real needs root, skipped elsewhere)
	@$(MAKE) --no-print-directory -j2 --output-sync=recurse lane-cpu lane-cluster

# The two lanes of `make test`; inside a lane the steps run one after the other.
# The unit tier's chart tests need helm: built here (or waited for, under build-tools.sh's
# lock, while the other lane builds every tool); cached, it only checks. Before that the
# images, after the unit tier the real node's tools: what the real tier needs, built while
# the cluster lane's builds and tests mostly wait (root only, as the real tier). Every
# build holds its own lock, so the real tier waits for one still running instead of
# building twice.
lane-cpu: venv plugin
	@$(MAKE) --no-print-directory -j1 lint plugin-test
	@if [ "$$(id -u)" = 0 ]; then bash hack/images.sh; fi
	@bash hack/build-tools.sh helm
	@$(MAKE) --no-print-directory -j1 unit
	@if [ "$$(id -u)" = 0 ]; then bash hack/build-tools.sh kubernetes-node coredns containerd; fi

lane-cluster: venv plugin
	@$(MAKE) --no-print-directory -j1 tools integration e2e real

lint: venv ## ruff, mypy --strict, import-linter contracts
	@$(PY) -m ruff check .
	@$(PY) -m ruff format --check .
	@$(PY) -m mypy dynamiccl tests benchmarks hack tests/fixtures/hosts/layouts.py
	@bash hack/lint-imports.sh

unit: venv plugin ## Unit tests (no cluster; the plugin's own build and C tests are plugin-test's)
	@$(PYTEST) -m unit -q --durations=15 --deselect $(PLUGIN_BUILD_TEST)

integration: venv plugin tools ## Integration tests (real kube-apiserver, PostgreSQL)
	@$(PYTEST) -m integration -q --durations=15

e2e: venv plugin tools ## End-to-end tests on the local control plane
	@$(PYTEST) -m e2e -q --durations=15

real: venv plugin tools ## Real-container tier on the real node (root, else skipped; builds the images; last in make test)
	@$(PYTEST) -m real -q -s --durations=15

plugin: ## Build plugin/build/libnccl-tuner-dynamiccl.so
	@$(MAKE) -s -C plugin

plugin-test: venv ## Plugin C tests, export check, short fuzz run, ASan and UBSan runs, glibc-2.17 x86_64 + aarch64 builds (aarch64 C tests under qemu)
	@$(PYTEST) -q -p no:cacheprovider $(PLUGIN_BUILD_TEST)
	@$(MAKE) -s -C plugin asan ubsan

gpu-test: venv ## GPU tier: the plugin in NCCL from the torch wheel, forced (algo, proto) sweep -> surface CSV (skips with one line without a GPU)
	@$(PY) hack/gpu_test.py

fuzz: ## Long fuzz run of the plugin's parsers (10^7 executions per target)
	@$(MAKE) -s -C plugin fuzz-long

bench: venv plugin ## Benchmarks (plugin, simulator, suite, tuner, compile, discovery, sidecar)
	@$(MAKE) -s -C plugin bench
	@for b in sim_bench suite tune_bench compile_bench discovery_bench sidecar_bench; do \
	  echo "== benchmarks/$$b.py"; $(PY) benchmarks/$$b.py; done

demo-cluster: venv plugin tools ## Jobs in a row: exploration finds, the loop retrains, a canary adopts (real pods on the real node as root; KWOK=1: kwok nodes)
	@bash hack/demo-cluster.sh $(if $(filter 1,$(KWOK)),--kwok)

images: ## Build the runtime and trainer images here (buildah, Debian bases; OCI archives cached by content)
	@bash hack/images.sh

tools: ## Build the pinned control plane, kwok, helm, training operator (cached)
	@bash hack/build-tools.sh

cluster-up: tools ## Start the local control plane: 16 fake GPU nodes (kwok) and a real node (containerd, kubelet; root)
	@bash hack/cluster-up.sh --no-build --real-node

cluster-down: ## Stop the local control plane and the real node (WIPE=1 also deletes its state)
	@bash hack/cluster-down.sh $(if $(filter 1,$(WIPE)),--wipe)

crds: venv ## Regenerate crds/ and the chart's CRDs from the pydantic models
	@$(PY) -m dynamiccl.operator.crdgen --out crds --out charts/dynamiccl/crds

clean: ## Remove build outputs of this checkout (not the shared cache)
	rm -rf .venv plugin/build .mypy_cache .ruff_cache .pytest_cache
