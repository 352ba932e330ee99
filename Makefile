# Every target does its own set-up: a fresh clone needs only python3, node and npm on PATH.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PYTHON := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)/runtime:$(CURDIR)/devtools:$(CURDIR)
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help setup test lint format pytest local cli synth worker upstream bench sim chaos drill clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

setup: $(VENV)/.installed node_modules/.installed ## Create the virtualenv and install pinned Python and npm packages

# The web client (clients/web): its own pinned npm packages, the demo pages built into
# clients/web/dist, and Debian's Chromium for the browser tests (never a tool's own download).
WEB := clients/web
WEB_SOURCES := $(shell find $(WEB)/src $(WEB)/index.html $(WEB)/react-use-websocket.html $(WEB)/vite.config.ts $(WEB)/vite.lib.config.ts $(WEB)/tsconfig.json $(WEB)/tsconfig.lib.json $(WEB)/tsconfig.node.json -type f 2>/dev/null)
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

$(WEB)/node_modules/.installed: $(WEB)/package.json $(WEB)/package-lock.json
	cd $(WEB) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(WEB)/dist/.built: $(WEB)/node_modules/.installed $(WEB_SOURCES)
	cd $(WEB) && npm run --silent build
	touch $@

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core

.PHONY: web
web: $(WEB)/dist/.built $(CHROMIUM) ## Build the web client and demo pages (clients/web/dist); install Chromium for the browser tests

lint: setup ## ruff: lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup ## ruff: fix what can be fixed and reformat
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

pytest: setup web
	$(PYTHON) -m pytest

test: lint pytest ## Everything CI runs: lint, then the whole test suite against local servers

local: setup ## The whole fleet on this machine with a live view (type k N to kill -9 worker N)
	$(PYTHON) -m streamfleet_dev.local.mode --workers 3 --streams 12

cli: ## The operator CLI: make cli ARGS="workers --json" (TABLE_NAME, QUEUE_URL, AWS_* from the environment)
	@$(MAKE) --no-print-directory setup >&2
	@$(PYTHON) -m streamfleet.cli $(ARGS)

.PHONY: preflight
preflight: synth ## With real credentials: what a deploy needs that synth cannot see (bootstrap, API Gateway role, Docker arm64, DNS, certificates, secret)
	@$(PYTHON) -m streamfleet.cli preflight --assembly cdk.out

synth: setup ## Synthesize all four stacks into cdk.out (no AWS credentials, no Docker)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH node_modules/.bin/cdk synth --quiet --no-notices
	@echo "Templates: $$(ls $(CURDIR)/cdk.out/*.template.json)"

bench: setup ## Benchmarks on local servers (~25 min): bench/results.md, bench/lease_results.md, PNG plots
	$(PYTHON) -m bench.fleet_bench
	$(PYTHON) -m bench.lease_bench

sim: setup ## Fault simulation: 2,000 seeded schedules (~55 min); SIM_SEED=<n> replays one
	$(PYTHON) -m streamfleet_dev.sim --schedules $${SIM_SCHEDULES:-2000}

chaos: setup ## Chaos soak: 3 minutes of kill -9, SIGTERM, SIGSTOP, restarts, churn, DynamoDB outages
	$(PYTHON) -m streamfleet_dev.local.chaos --duration 180 --workers 5 --streams 60

drill: setup ## Regional failover drill of the WebSocket API, locally (two regions, canary, DNS stand-in)
	$(PYTHON) -m streamfleet_dev.wsapi.drill --markdown

worker: setup ## Run one worker (configure with TABLE_NAME, QUEUE_URL, ... see README)
	$(PYTHON) -m streamfleet.worker

upstream: setup ## Run the fake upstream on port 8765
	$(PYTHON) -m streamfleet_dev.upstream.fake --port 8765 --rate 5

clean: ## Remove the virtualenv, node_modules and caches
	rm -rf $(VENV) node_modules .pytest_cache .ruff_cache .hypothesis cdk.out
	rm -rf $(WEB)/node_modules $(WEB)/dist $(WEB)/test-artifacts
