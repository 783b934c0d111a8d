# casetrail: `make demo` and `make test` work on a fresh machine with Python 3.11+,
# RabbitMQ and PostgreSQL installed locally (or started with `docker compose up -d
# rabbitmq postgres`).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck services install bench clean up

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

services:
	@scripts/ensure-services

demo: install services
	$(BIN)/casetrail demo

up: install services
	$(BIN)/casetrail up

lint: install
	$(BIN)/ruff check .

typecheck: install
	$(BIN)/mypy

test: install services lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
