# Every target does its own set-up: a fresh clone needs only python3, node and npm on PATH.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PYTHON := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)/runtime:$(CURDIR)/clients/python:$(CURDIR)/devtools:$(CURDIR)/examples/auction:$(CURDIR)
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help setup test lint format pytest local cli synth worker upstream bench cost sim sim-realtime chaos drill clean

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# The virtualenv holds one of four fully pinned sets (requirements/*.txt) or all of them
# (requirements.txt, their union): runtime (the deployed code and the CLI), cdk (the CDK app),
# local (the local servers), dev (tests, linters, plots). make local installs runtime + cdk +
# local; make setup and make test install everything.
PIP_INSTALL := $(PYTHON) -m pip install --quiet --disable-pip-version-check
SETS := runtime cdk local dev

$(PYTHON):
	python3 -m venv $(VENV)

# The checkout's import roots on the virtualenv's path (what PYTHONPATH says, for a
# .venv/bin/python run outside make): a .pth file, as an editable install would write.
$(VENV)/.checkout: Makefile | $(PYTHON)
	printf '%s\n' "$(CURDIR)/runtime" "$(CURDIR)/clients/python" "$(CURDIR)/devtools" "$(CURDIR)/examples/auction" "$(CURDIR)" \
	  > "$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/streamfleet-checkout.pth"
	touch $@

$(VENV)/.installed-%: requirements/%.txt | $(PYTHON)
	$(PIP_INSTALL) -r $<
	touch $@

$(VENV)/.installed: requirements.txt | $(PYTHON)
	$(PIP_INSTALL) -r requirements.txt
	touch $@ $(SETS:%=$(VENV)/.installed-%)

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

RUNTIME_ENV := $(VENV)/.checkout $(VENV)/.installed-runtime
CDK_ENV := $(RUNTIME_ENV) $(VENV)/.installed-cdk node_modules/.installed
LOCAL_ENV := $(CDK_ENV) $(VENV)/.installed-local

setup: $(VENV)/.installed $(VENV)/.checkout node_modules/.installed ## Create the virtualenv and install every pinned Python and npm package

# The web client (clients/web): its own pinned npm packages, the demo pages built into
# clients/web/dist, and Debian's Chromium for the browser tests (never a tool's own download).
WEB := clients/web
WEB_SOURCES := $(shell find $(WEB)/src $(WEB)/scripts/package-lib.mjs $(WEB)/index.html $(WEB)/react-use-websocket.html $(WEB)/vite.config.ts $(WEB)/vite.lib.config.ts $(WEB)/tsconfig.json $(WEB)/tsconfig.lib.json $(WEB)/tsconfig.node.json -type f 2>/dev/null)
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

# The tiers (tests/<tier>, a marker each). The gate holds what asserts outcomes only, whatever the
# machine's speed; what depends on real time (fleets of real workers, the fault harness, drills,
# local mode, the browser, chaos, the seeded lease simulation) is the e2e tier, held to the same
# standard of assertions but run by make test-e2e.
GATE_TIERS := tests/unit tests/infra tests/artifact tests/integration
E2E_TIERS := tests/e2e tests/sim

pytest: setup $(WEB)/dist/.built
	$(PYTHON) -m pytest --durations=15 $(GATE_TIERS)

test: lint pytest ## The gate, what CI runs: lint, then the unit, infra, artifact and integration tiers

.PHONY: test-unit test-e2e test-all
test-unit: setup ## The unit tier alone (under a minute): the inner loop
	$(PYTHON) -m pytest tests/unit -q

test-e2e: setup web ## The real-time tier: worker fleets, fault harness, drills, local mode, browser, chaos, simulation (fresh seeds)
	$(PYTHON) -m pytest --durations=15 $(E2E_TIERS)

test-all: test test-e2e ## Both: the gate, then the real-time tier

# Local mode synthesizes the app (it runs what the assembly says), so it needs the CDK set too.
local: $(LOCAL_ENV) $(WEB)/dist/.built ## The whole system on this machine, live: the fleet, both WebSocket regions, the demo page
	$(PYTHON) -m streamfleet_dev.local.mode --workers 3 --streams 12

# The CDK CLI pinned in package.json (installed by npm ci from package-lock.json, never a
# download of the latest), with the virtualenv's python3 first on PATH (cdk.json runs app.py).
CDK_CLI := PATH=$(CURDIR)/$(VENV)/bin:$$PATH node_modules/.bin/cdk

.PHONY: cdk
cdk: $(CDK_ENV) ## The CDK CLI with this virtualenv, no activation needed: make cdk ARGS="deploy ..."
	$(CDK_CLI) $(ARGS)

# diff, deploy and destroy act on a stage, STAGE=<name>: a Region's pair of stacks (its fleet
# stack and its WebSocket API stack, named in stacks/), or all four. The app has no other notion
# of a stage: the Regions themselves are context (streamfleet:primary_region, ...), which ARGS can
# set like any key (ARGS="-c streamfleet:account=123456789012"). A STAGE that names no stage
# stops make before anything runs, with one line that names the variable.
STAGES := primary secondary all
STAGE_STACKS_primary := StreamFleet-Primary StreamFleet-WebSocket-Primary
STAGE_STACKS_secondary := StreamFleet-Secondary StreamFleet-WebSocket-Secondary
ifneq ($(filter diff deploy destroy,$(MAKECMDGOALS)),)
ifneq ($(words $(STAGE)) $(filter $(STAGES),$(STAGE)),1 $(STAGE))
$(error STAGE: expected primary, secondary or all (make $(firstword $(filter diff deploy destroy,$(MAKECMDGOALS))) STAGE=primary), got '$(STAGE)')
endif
endif
# diff and deploy: exactly the stage's stacks (--exclusively: deploying the secondary never
# redeploys the primary it depends on). destroy: the stage's stacks and every stack that depends
# on them (CDK's default: destroying the primary takes the secondary with it, and its prompt
# names them all); all: --all.
STAGE_ONLY := $(if $(filter all,$(STAGE)),--all,--exclusively $(STAGE_STACKS_$(STAGE)))
STAGE_WITH_DEPENDENTS := $(if $(filter all,$(STAGE)),--all,$(STAGE_STACKS_$(STAGE)))
# destroy asks first (CDK's prompt, on a terminal); FORCE=1 on make's command line skips the
# question. FORCE from the environment does not count: an unrelated variable must not delete stacks.
DESTROY_FORCE := $(if $(and $(filter command line,$(origin FORCE)),$(filter 1,$(FORCE))),--force)

.PHONY: diff deploy destroy
diff: $(CDK_ENV) ## Compare a stage's stacks with what is deployed: make diff STAGE=primary|secondary|all (ARGS="-c ..." passes on)
	$(CDK_CLI) diff $(STAGE_ONLY) $(ARGS)

deploy: $(CDK_ENV) ## Deploy a stage's stacks with the pinned CDK CLI: make deploy STAGE=primary|secondary|all (ARGS="-c ...")
	$(CDK_CLI) deploy $(STAGE_ONLY) $(ARGS)

destroy: $(CDK_ENV) ## Delete a stage's stacks and their dependents, after a y/n question: make destroy STAGE=... (FORCE=1: no question)
	@if [ -z "$(DESTROY_FORCE)" ] && [ ! -t 0 ]; then echo "error: FORCE: make destroy asks before deleting and stdin is not a terminal; to delete without asking, set FORCE=1 on make's command line" >&2; exit 1; fi
	$(CDK_CLI) destroy $(strip $(DESTROY_FORCE) $(STAGE_WITH_DEPENDENTS)) $(ARGS)

# The integration test on a real account (integ/README.md). integ/integ_streamfleet.py is an
# integ-runner test case (IntegTest, integ.json), but no integ-runner release reads the cloud
# assembly schema aws-cdk-lib 2.275 writes (55; integ-runner 2.197.10 stops at 53), so
# streamfleet_integ.run does its deploy, assert and destroy with the CDK CLI pinned here. It
# checks settings and credentials first: without them it says how to run it, one error line,
# exit 1, and nothing is synthesized. ARGS=--no-clean keeps the stacks.
.PHONY: integ
integ: $(CDK_ENV) ## Integration test on a real account, both Regions (an estimated 1-1.5 h, deletes what it deploys): integ/README.md
	cd integ && PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(abspath $(PYTHON)) -m streamfleet_integ.run $(ARGS)

cli: ## The operator CLI: make cli ARGS="workers --json" (TABLE_NAME, QUEUE_URL, AWS_* from the environment)
	@$(MAKE) --no-print-directory setup >&2
	@$(PYTHON) -m streamfleet_ops.cli $(ARGS)

.PHONY: preflight
preflight: synth ## With real credentials: what a deploy needs that synth cannot see (bootstrap, API Gateway role, Docker arm64, DNS, certificates, secret)
	@$(PYTHON) -m streamfleet_ops.cli preflight --assembly cdk.out

synth: setup ## Synthesize all four stacks into cdk.out (no AWS credentials, no Docker)
	$(CDK_CLI) synth --quiet --no-notices
	@echo "Templates: $$(ls $(CURDIR)/cdk.out/*.template.json)"

bench: setup $(WEB)/dist/.built $(CHROMIUM) ## Benchmarks on local servers (~50 min): their figures and plots into docs/benchmarks/
	$(PYTHON) -m bench.fleet_bench
	$(PYTHON) -m bench.lease_bench
	$(PYTHON) -m bench.task_events_bench
	$(PYTHON) -m bench.hold_off_bench
	$(PYTHON) -m bench.fanout_bench
	$(PYTHON) -m bench.fanout_stall_bench
	$(PYTHON) -m bench.sim_bench

# The workload make cost prices: STREAMS, MSG_PER_S (per stream), SUBSCRIBERS (per stream) are
# required; REGIONS (1 or 2), MESSAGE_BYTES, BATCHING_WINDOW (none or 0.5) have defaults.
REGIONS ?= 2
MESSAGE_BYTES ?= 200
BATCHING_WINDOW ?= none
cost: setup ## The monthly bill by component: make cost STREAMS=500 MSG_PER_S=1 SUBSCRIBERS=10 [REGIONS=2 MESSAGE_BYTES=200 BATCHING_WINDOW=none]
	$(PYTHON) -m streamfleet_dev.cost --streams "$(STREAMS)" --msg-per-s "$(MSG_PER_S)" --subscribers "$(SUBSCRIBERS)" --regions "$(REGIONS)" --message-bytes "$(MESSAGE_BYTES)" --batching-window "$(BATCHING_WINDOW)"

sim: setup ## Both simulations on a virtual clock: 10,000 fresh seeded schedules of each; SIM_SEED=<n> [SIM_SYSTEM=lease|live] replays one, the same bytes every time
	$(PYTHON) -m streamfleet_dev.dsim --system $${SIM_SYSTEM:-all} --schedules $${SIM_SCHEDULES:-10000} --jobs $$(nproc)

sim-realtime: setup ## The fault simulation in real time: real workers on dynalite, 2,000 seeded schedules (~55 min); SIM_SEED=<n> reruns one
	$(PYTHON) -m streamfleet_dev.sim --schedules $${SIM_SCHEDULES:-2000}

chaos: setup ## Chaos soak: 3 minutes of kill -9, SIGTERM, SIGSTOP, restarts, churn, DynamoDB outages
	$(PYTHON) -m streamfleet_dev.local.chaos --duration 180 --workers 5 --streams 60

drill: setup $(WEB)/dist/.built $(CHROMIUM) ## Failover drill of the WebSocket API, then the end-to-end live-delivery drill (fleet, fan-out, Python clients and browser pages); writes docs/benchmarks/drill.md
	$(PYTHON) -m streamfleet_dev.wsapi.drill --markdown --page

worker: setup ## Run one worker (configure with TABLE_NAME, QUEUE_URL, ... see docs/worker.md)
	$(PYTHON) -m streamfleet.worker

upstream: setup ## Run the fake upstream on port 8765
	$(PYTHON) -m streamfleet_dev.upstream.fake --port 8765 --rate 5

clean: ## Remove the virtualenv, node_modules and caches
	rm -rf $(VENV) node_modules .pytest_cache .ruff_cache .hypothesis cdk.out
	rm -rf $(WEB)/node_modules $(WEB)/dist $(WEB)/test-artifacts
