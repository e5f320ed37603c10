# The two commands a newcomer needs:  make demo   and   make test
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export AIRFLOW_HOME ?= $(CURDIR)/.airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__UNIT_TEST_MODE := False
export AIRFLOW__LOGGING__LOGGING_LEVEL ?= WARNING
DEMO_END ?= 2026-11-01T12:00:00+00:00
# the tests on every core (at most 4), in the scopes tests/conftest.py sets, in collection order (the long
# unit of the running Airflows starts first); PYTEST_WORKERS= runs them in one process
PYTEST_WORKERS ?= -n auto --maxprocesses 4 --dist loadscope --no-loadscope-reorder

.PHONY: venv demo test services bench clean

$(STAMP): requirements.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt -c constraints.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

## make demo: install, prepare a local Airflow home, run the whole DAG chain on the
## embedded virtual datacenter with a SQLite staging file, print what each stage did.
demo: $(STAMP)
	bash scripts/demo.sh "$(DEMO_END)"

## make test: install what the tests need, start the services they use, run pytest.
test: $(STAMP)
	bash scripts/install-test-tools.sh
	bash scripts/install-services.sh
	$(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf .airflow .services .pytest_cache
