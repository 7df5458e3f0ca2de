# DDTree tree-verify for SGLang on sm_120: developer and operator entry points.
# `make setup` then `make test` take a fresh machine to a passing test suite.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
PYTEST_ARGS ?=

.PHONY: help setup test test-gpu test-sglang-gpu gpu-carry test-server-gpu train-pair lint fit wheel clean bench-kernels sglang-wheel release-job smoke-test bench \
	deploy check rollback testhost testhost-up testhost-down

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

setup: $(BIN)/.installed  ## create .venv with the dev tools, ddtree_kernels and ddtree-ops (editable)

$(BIN)/.installed: pyproject.toml kernels/pyproject.toml
	@# The deploy tests' local test hosts need sshd (Debian's openssh-server); root installs it here.
	@if [ ! -x /usr/sbin/sshd ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq openssh-server >/dev/null; \
	  else echo "warning: /usr/sbin/sshd missing: the deploy tests need 'apt-get install openssh-server' (as root)"; fi; fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=25.1"
	$(PY) -m pip install --quiet --group dev
	$(PY) -m pip install --quiet --no-deps -e kernels
	$(PY) -m pip install --quiet -e ".[plot,release-job,controller]"
	@touch $@
	@echo "setup done: $(VENV) ($$($(PY) -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'))"

lint: setup  ## ruff, and ansible-lint --profile production on playbooks/, roles/, inventory/
	$(BIN)/ruff check .
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ansible-lint --profile production --offline -q playbooks roles inventory

# The DDTree branch snapshots the patch and deploy tests build (the team's ../shared/sglang-src).
TEST_SNAPSHOTS := $(or $(DDTREE_SGLANG_SNAPSHOTS),../shared/sglang-src)

# Whole files to a worker, in collection order: the two deploy files (the longest: test_deploy.py ~19 min,
# test_deploy_checks_and_fab.py ~8 min, each with test hosts of its own) go first, one to each worker, and
# the other files to whichever worker frees first.
test: setup lint  ## lint + every test that runs without a GPU (pytest exit 5, nothing collected, fails)
	@ls $(TEST_SNAPSHOTS)/sglang-ddtree-*.tar.gz >/dev/null 2>&1 || { echo "no DDTree snapshots \
	(sglang-ddtree-*.tar.gz) in $(TEST_SNAPSHOTS): the patch and deploy tests build them. Clone next to the \
	team's shared/ folder, or set DDTREE_SGLANG_SNAPSHOTS=DIR"; exit 2; }
	@$(BIN)/pytest -m "not gpu" -n 2 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

GPU_PYTHON ?= python3
# EMULATE=sm120: the sm_120 kernel path on the GPU at hand (plans for capability 12.0, dots on mma.sync).
EMULATE ?=
test-gpu:  ## on a CUDA machine's own python (torch + triton): every kernel test, realistic sizes included [EMULATE=sm120]
	DDTREE_EMULATE=$(EMULATE) PYTHONPATH=kernels $(GPU_PYTHON) -m pytest tests/kernels -v -p no:cacheprovider $(PYTEST_ARGS)

# SGLang's real DDTree verify path around our kernel (tests/sglang_gpu; tests/README.md lists the
# pure-Python wheels it needs beside the GPU machine's torch). The ddtree-v2 snapshot is read from
# ../shared/sglang-src, or DDTREE_SGLANG_PYTHON names an already patched python/ folder.
SGLANG_SNAPSHOTS ?= $(firstword $(wildcard ../shared/sglang-src) .cache/sglang-src)
test-sglang-gpu:  ## on a CUDA machine: SGLang's own DDTree backend, pools and CUDA graphs around our kernel
	DDTREE_SGLANG_SNAPSHOTS=$(SGLANG_SNAPSHOTS) PYTHONPATH="kernels:.:$$PYTHONPATH" $(GPU_PYTHON) -m pytest tests/sglang_gpu \
	  -v -p no:cacheprovider $(PYTEST_ARGS)

# A real SGLang server on a GPU machine without a package index: `make gpu-carry` here packs .gpu/
# (tests/server_gpu/carry.py), then on the GPU machine `make test-server-gpu` (tests/server_gpu/e2e.py).
E2E_ARGS ?=
gpu-carry: setup  ## pack into .gpu/ what test-server-gpu needs on a GPU machine without a package index
	$(PY) -m tests.server_gpu.carry

test-server-gpu:  ## on a CUDA machine, after gpu-carry: the production launch served for real, smoke, bench, profiles
	PYTHONUNBUFFERED=1 $(GPU_PYTHON) -m tests.server_gpu.e2e $(E2E_ARGS)

# A target in GLM-5's architecture and its DFlash drafter, trained on one GPU in ~5 minutes (tests/server_gpu/
# train_pair.py) into .gpu/models-trained, where `make test-server-gpu E2E_ARGS="--stand-in trained ..."` serves
# them (and trains them first where they are missing). TRAIN_ARGS, e.g. "--seed 1 --out DIR".
TRAIN_ARGS ?=
train-pair:  ## on a CUDA machine: train the pair the real-server run serves with --stand-in trained
	PYTHONUNBUFFERED=1 $(GPU_PYTHON) -m tests.server_gpu.train_pair $(TRAIN_ARGS)

SGLANG_VERSION ?= 0.5.23
SGLANG_WHEEL ?= $(firstword $(wildcard .cache/wheels/sglang-$(SGLANG_VERSION)-*.whl))
BENCH_OUT ?= bench-out
bench-kernels:  ## on a CUDA machine: the side-by-side kernel benchmark (BENCHMARKS.md); SGLANG_WHEEL=path [EMULATE=sm120]
	@test -n "$(SGLANG_WHEEL)" || { echo "no SGLang wheel: run 'make sglang-wheel' (needs the package index) or pass SGLANG_WHEEL=path"; exit 2; }
	PYTHONPATH=kernels $(GPU_PYTHON) -m ddtree_tools.bench --sglang-wheel $(SGLANG_WHEEL) --out $(BENCH_OUT) \
	  $(if $(EMULATE),--emulate $(EMULATE))

sglang-wheel: setup  ## download the pinned SGLang wheel (no dependencies) into .cache/wheels
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: sglang==$(SGLANG_VERSION) -d .cache/wheels
	@ls .cache/wheels/sglang-$(SGLANG_VERSION)-*.whl

ENDPOINT ?=
SMOKE_ARGS ?=
smoke-test: setup  ## make smoke-test HOST=ct200 (on the host; no HOST: the local test host), or ENDPOINT=http://host:30000 from here
	$(CHECK_INVENTORY)
	@if [ -n "$(ENDPOINT)" ] && [ -z "$(HOST)" ]; then $(BIN)/ddtree-ops smoke --endpoint $(ENDPOINT) $(SMOKE_ARGS); \
	else $(PY) -m ddtree_ops.hosts guard $(TARGET) $(INVENTORY_PATH) && $(ANSIBLE) $(INVENTORY_ARG) playbooks/smoke.yml \
	  --limit $(TARGET); fi

BENCH_ARGS ?=
# No ENDPOINT: the local test host's server, as smoke-test, check and rollback default to it.
TESTHOST_ENDPOINT := http://10.213.1.2:30000
bench: setup  ## decode throughput vs context length of a live endpoint: make bench ENDPOINT=... (no ENDPOINT: the local test host)
	@$(if $(and $(HOST),$(if $(ENDPOINT),,1)),echo "make bench HOST=$(HOST): bench measures an endpoint from here; give \
	ENDPOINT=http://ADDRESS:PORT (the server listens on 127.0.0.1 by default: \`.venv/bin/fab tunnel --host $(HOST)\` \
	first, then ENDPOINT=http://127.0.0.1:30000)"; exit 2)
	@$(if $(ENDPOINT),,$(PY) -m ddtree_ops.hosts guard ct-test-1)
	$(BIN)/ddtree-ops bench --endpoint $(or $(ENDPOINT),$(TESTHOST_ENDPOINT)) --out throughput-out $(BENCH_ARGS)

RELEASE_OUT ?= release-report
release-job: setup  ## apply patches/ to every SGLang release on PyPI since 0.5.14; writes $(RELEASE_OUT)/matrix.{json,md}
	$(BIN)/ddtree-ops release-job --out $(RELEASE_OUT) $(if $(VERSIONS),--versions $(VERSIONS))

fit: setup  ## compile every kernel config for sm_120 and sm_90 offline, print the resource table
	PYTHONPATH=kernels $(PY) -m ddtree_tools.fit

wheel: setup  ## build the ddtree_kernels wheel into dist/ (what the playbooks install)
	$(PY) -m pip wheel --quiet --no-deps -w dist ./kernels
	@ls dist/ddtree_kernels-*.whl

# --- deployment (playbooks/, inventory/, roles/) ------------------------------------------
# With HOST: the production inventory (or INVENTORY=...). Without HOST: a throwaway local test
# host (a network namespace with its own sshd and a stand-in server; README "Deploy").
HOST ?=
INVENTORY ?= inventory/production/hosts.yml
ARGS ?=
ANSIBLE := ANSIBLE_CONFIG=ansible.cfg PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ansible-playbook
# deploy and rollback: on Ctrl-C, SIGTERM or a lost host, playbooks/resume.yml puts back a verified release (ddtree_ops/play.py).
# exec: the recipe's shell would die of a SIGTERM or SIGHUP to the group at once, and make would return while the
# resume still runs; make waits for its direct child, the wrapper, whatever the signal.
PLAY := ANSIBLE_CONFIG=ansible.cfg PATH="$(CURDIR)/$(BIN):$$PATH" exec $(PY) -m ddtree_ops.play
TESTHOST_DIR := .cache/testhosts
INVENTORY_PATH = $(if $(HOST),$(INVENTORY),inventory/test)
INVENTORY_ARG = -i $(INVENTORY_PATH)
TARGET = $(if $(HOST),$(HOST),ct-test-1)
# A target that is a local test host (no HOST, HOST=ct-test-*, or INVENTORY=inventory/test): stop before any SSH
# or HTTP if its namespace is not there (its address would leave through the default route).
GUARD_TESTHOST = @$(PY) -m ddtree_ops.hosts guard $(TARGET) $(INVENTORY_PATH)
# An inventory that is not there stops here, naming it (ansible.cfg also fails an unparsable one).
CHECK_INVENTORY = @$(if $(HOST),test -e $(INVENTORY) || { echo "no inventory at $(INVENTORY): set INVENTORY=path \
(default inventory/production/hosts.yml)"; exit 2; })

deploy: setup  ## make deploy HOST=ct200 [ARGS="-e ddtree_budget=16"]; no HOST: the DDTree branch on a local test host
	$(CHECK_INVENTORY)
	@$(if $(HOST),,$(MAKE) --no-print-directory testhost)
	$(GUARD_TESTHOST)
	$(PLAY) playbooks/deploy.yml $(INVENTORY_ARG) --limit $(TARGET) $(ARGS)

check: setup  ## make check HOST=ct200: what deploy would change (--check --diff), touching nothing
	$(CHECK_INVENTORY)
	$(GUARD_TESTHOST)
	$(ANSIBLE) $(INVENTORY_ARG) playbooks/deploy.yml --limit $(TARGET) --check --diff $(ARGS)

rollback: setup  ## make rollback HOST=ct200 [ARGS="-e rollback_to=RELEASE_ID"] (a failed release: also -e rollback_force=true)
	$(CHECK_INVENTORY)
	$(GUARD_TESTHOST)
	$(PLAY) playbooks/rollback.yml $(INVENTORY_ARG) --limit $(TARGET) $(ARGS)

testhost: setup  ## start the local test host ct-test-1 and its DDTree git source (kept until make testhost-down)
	@if [ -f $(TESTHOST_DIR)/testhosts.json ] && [ -f $(TESTHOST_DIR)/sglang-git/ddtree-v2.commit ] && \
	  ip netns list | grep -q '^ddt-host1'; then \
	  echo "test host ct-test-1 is up (10.213.1.2:2222; make testhost-down removes it)"; \
	else $(PY) -m tests.support.testhost up --dir $(TESTHOST_DIR) --count 1; fi

testhost-up: testhost  ## the same as make testhost

testhost-down:  ## remove every test-host namespace on this machine (ddt-host1 and every test run's, a running test's too), their processes and links
	$(PY) -m tests.support.testhost down --dir $(TESTHOST_DIR)

clean:  ## remove build outputs (keeps .venv)
	rm -rf dist build kernels/build kernels/*.egg-info .pytest_cache .ruff_cache
