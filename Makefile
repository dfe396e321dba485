# The two commands of the README: `make demo` and `make test`. Each sets up what it needs:
# a virtualenv in .venv and the upstream binaries (built once, cached in ~/.cache/stormtopo).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint unit integration bench bench-quick bench-sim bench-preempt bench-heal binaries prometheus clean soak compat lock

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cli,dev,plot]'
	touch $@

binaries: $(BIN)/.installed
	$(BIN)/stormtopo dev build

# prometheus and promtool from Debian's package, unpacked into ~/.cache/stormtopo (no root, no system
# change): the chart's alert rules are unit-tested with promtool and its queries against a real scrape.
prometheus: $(BIN)/.installed
	$(BIN)/python -m stormtopo.devenv.prometheus

lint: $(BIN)/.installed
	$(BIN)/ruff check stormtopo tests bench
	$(BIN)/ruff format --check stormtopo tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: $(BIN)/.installed
	$(BIN)/pytest -q tests --ignore=tests/integration

integration: binaries prometheus
	$(BIN)/pytest -q tests/integration

# --durations=30: the 30 slowest tests, printed at the end of every run (where the suite's time goes).
# -n 2 --dist loadfile: two workers, a test module whole on one of them (its module fixtures, its cluster);
# each worker starts its own session cluster. The integration tests mostly wait on their clusters (the
# machine is about 80% idle under one worker), so two halve the wall time. TEST_WORKERS=1 runs one.
TEST_WORKERS ?= 2
test: binaries prometheus lint
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=30 tests

# The image's dependencies, pinned with hashes (the Dockerfile installs them with --require-hashes), resolved
# for the image's Python (read from the Dockerfile's base image) on Linux x86_64 (Debian bookworm's glibc):
# operator.lock from pyproject.toml's dependencies, build.lock from its build-system requires (what builds the
# wheel). Versions already locked are kept while pyproject.toml allows them; `make lock LOCK_UPGRADE=--upgrade`
# moves everything to the newest allowed.
IMAGE_PYTHON := $(shell sed -n 's/^FROM python:\([0-9.]*\)-.*/\1/p' Dockerfile | head -n1)
LOCK_COMPILE = $(BIN)/uv pip compile --quiet --generate-hashes $(LOCK_UPGRADE) --python-version $(IMAGE_PYTHON) \
	--python-platform x86_64-manylinux_2_36
LOCK_HEADER = \# `make lock` writes this file from pyproject.toml; the Dockerfile installs it with pip --require-hashes.
lock: $(BIN)/.installed
	$(LOCK_COMPILE) pyproject.toml -o requirements/operator.lock
	$(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
		| $(LOCK_COMPILE) - -o requirements/build.lock
	sed -i '1i $(LOCK_HEADER)' requirements/operator.lock requirements/build.lock

demo: binaries
	$(BIN)/stormtopo demo

# `python -m bench SUBCOMMAND` runs each benchmark (`python -m bench --help`); each writes bench/results/NAME.json
# with its command line, commit, machine and versions. BENCHMARKS.md quotes the current figures.
# Small versions of the full run on 16 nodes, about 3 minutes; the last line is one JSON object.
bench-quick: binaries
	$(BIN)/python -m bench quick

# The scale simulator: Volcano v1.15.1's allocate action and plugins without a cluster, on 1,024,
# 4,096 and 16,384 nodes; about 10 minutes on 2 cores (576 s on 2026-12-03). bench/results/sim.{json,md}; see BENCHMARKS.md.
# `python -m bench sim --help` for smaller runs (--nodes 1024=16 --starts empty --settings shipped).
bench-sim: $(BIN)/.installed
	$(BIN)/python -m bench sim

# Preemption: Volcano v1.15.1's gangpreempt on fragmented 64- and 1,024-node clusters in the
# simulator, its victims against the exact minimum (HiGHS). bench/results/preemption.{json,md}; see BENCHMARKS.md
# "Preemption: victims against the minimum". `python -m bench preemption --quick`: 64 nodes only, seconds.
bench-preempt: $(BIN)/.installed
	$(BIN)/python -m bench preemption

# Everything, about an hour on 2 cores (58.5 min on 2026-12-03): 256 nodes, placement on 1,024, the two PodGroup
# expressions on 1,024, 1,000 StormServices on 1,024, admission with pending gangs, 4,096 nodes.
bench: binaries
	$(BIN)/python -m bench full
	$(BIN)/python -m bench large
	$(BIN)/python -m bench expressions
	$(BIN)/python -m bench scale --services 1000
	$(BIN)/python -m bench admission
	$(BIN)/python -m bench scale-nodes

# Healing under churn, BENCHMARKS.md "Healing": the same seeded stream of soft tier-1
# StormServices on 256 fragmented nodes, without and with stormtopo.io/heal; 6 simulated hours at 30x,
# about 30 minutes on 2 cores (26 min 55 s on 2026-12-03) (`python -m bench heal --quick`: 2 simulated hours at 60x, 10.5 minutes).
bench-heal: binaries
	$(BIN)/python -m bench heal

# The soaks of RELIABILITY.md, about 45 minutes on 2 cores: 20 SIGKILLs each of kube-apiserver, etcd,
# vc-scheduler, AIBrix and the operator's leader during churn (STORMTOPO_SOAK_SEED=N repeats a run), then
# kopf's StormService watch answered 503 for 25 minutes (STORMTOPO_SOAK_OUTAGE_SECONDS shortens it), then
# kube-apiserver stopped 4 minutes in a healing pass (STORMTOPO_SOAK_BROWNOUT_SECONDS shortens it).
soak: binaries
	STORMTOPO_SOAK=1 $(BIN)/pytest -q -s tests/integration/test_soak.py tests/integration/test_soak_watch_outage.py tests/integration/test_soak_brownout.py

# The compatibility scenario (seed, scale 3 to 4, nested, multi-node role, bad input) on every AIBrix x Volcano
# pair the module proxy serves, and the newest pair on every other served Kubernetes release, one cluster at a
# time; records each in COMPATIBILITY.md. Builds each release once (cached; a Kubernetes release cold takes
# 15-20 min on 2 cores); takes /tmp/stormtopo-cluster.lock per run, so do not wrap it in flock.
compat: $(BIN)/.installed
	$(BIN)/python -m stormtopo.devenv.compat

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
