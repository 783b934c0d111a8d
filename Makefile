# casetrail: `make demo` and `make test` work on a fresh machine with Python 3.11+,
# RabbitMQ and PostgreSQL installed locally (or started with `docker compose up -d
# rabbitmq postgres`).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-unit upgrade-check test-faults test-faults-soak lint typecheck services browser promtool go-interop install bench bench-all bench-smoke clean up

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

services:
	@scripts/ensure-services

browser:
	@scripts/ensure-browser

promtool:
	@scripts/ensure-promtool

go-interop:
	@scripts/ensure-go-interop

demo: install services
	$(BIN)/casetrail demo

up: install services
	$(BIN)/casetrail up

# mypy and import-linter read the installed package's shape (service/ and consumers/
# as casetrail), from the tree of links scripts/package-tree builds.
lint: install
	$(BIN)/ruff check .
	$(BIN)/python scripts/package-tree
	PYTHONPATH=build/tree $(BIN)/lint-imports
	$(BIN)/python scripts/house-measures --check
	$(BIN)/python scripts/dead-code

typecheck: install
	$(BIN)/python scripts/package-tree
	$(BIN)/mypy

# The bus-facing suites run a second time on the public aiormq path only
# (service/adapters/bus/fastpath.py switched off), so both paths stay tested.
BUS_TESTS := tests/integration/test_pipeline.py tests/integration/test_publisher.py \
             tests/integration/test_deliveries.py tests/integration/test_worker_tools.py \
             tests/integration/test_processes.py tests/integration/test_fastpath.py

# The tiers (tests/*/__init__.py says what each may use): the unit tier needs no broker,
# no database, no browser, no root and no network once installed, and finishes within a
# minute. Alone it checks each property on a tenth of its examples; `make test` (and CI)
# runs them all (tests/support/properties.py).
test-unit: install
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

test: export CASETRAIL_PROPERTIES := thorough
test: install lint typecheck test-unit services browser promtool go-interop
	$(BIN)/pytest -q -p no:cacheprovider tests/integration tests/browser
	CASETRAIL_AMQP_FASTPATH=off $(BIN)/pytest -q -p no:cacheprovider $(BUS_TESTS)

# A stack of the previous release, holding cases, upgraded to this tree: every old case
# and bundle still verifies (docs/releasing.md; CI runs it).
upgrade-check: install services
	$(BIN)/python scripts/upgrade-check

# Benchmarks: matplotlib for the plots in the project venv, and the peer
# (LangGraph) in its own venv so it never becomes a project dependency.
PEER := bench/.venv-peer
$(PEER)/.installed:
	$(PYTHON) -m venv $(PEER)
	$(PEER)/bin/pip install --quiet langgraph langgraph-checkpoint-postgres 'psycopg[binary]' psycopg-pool langchain-core
	touch $@

bench: install services $(PEER)/.installed
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	@command -v ab >/dev/null || apt-get install -y -q apache2-utils >/dev/null
	$(BIN)/python -m bench.run

# make bench, and the scenarios too long for it: inclusion proofs from a tree of
# 10,000,000 leaves (seeded once into a cached database, casetrail_bench_ledger_10000000).
bench-all: install services $(PEER)/.installed
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	@command -v ab >/dev/null || apt-get install -y -q apache2-utils >/dev/null
	$(BIN)/python -m bench.run --all

# A small run of the bench pipelines under the least-privileged identities (CI).
bench-smoke: install services
	@command -v ab >/dev/null || apt-get install -y -q apache2-utils >/dev/null
	$(BIN)/python -m bench.smoke

# The fault suite stops and starts RabbitMQ and PostgreSQL on this machine: run it
# where nothing else depends on them.
test-faults: install services
	$(BIN)/pytest -q -p no:cacheprovider faults

# The soak: the randomized cluster runs twenty times (about 20 minutes on 2 cores).
test-faults-soak: install services
	CASETRAIL_FAULT_RUNS=20 $(BIN)/pytest -q -p no:cacheprovider -s faults/test_cluster.py \
	    -k randomized

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
