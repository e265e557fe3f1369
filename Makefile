# sluice: `make run` (set-up + end-to-end demo) and `make test` (set-up + the whole suite).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The pinned jars (include/sluice/core/jars.lock) are fetched into a per-machine cache, once.
JARS_STAMP := $(VENV)/.jars
export SLUICE_HOME ?= $(CURDIR)/.sluice
export PYSPARK_PYTHON := $(CURDIR)/$(BIN)/python
export PYSPARK_DRIVER_PYTHON := $(CURDIR)/$(BIN)/python
export TZ := UTC
# Airflow reads sluice's DAGs and plugin from this repo for every target here (`make airflow`, `make run`,
# `make test`), unless you set these yourself. Outside make, export them (see README, "Orchestration").
export AIRFLOW__CORE__DAGS_FOLDER ?= $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER ?= $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES ?= False

.PHONY: class-data line-scan setup run test test-fast lint bench bench-cluster bench-smoke clean java-check chromium-check airflow \
	postgres-check platform platform-down platform-demo

java-check:
	@command -v java >/dev/null 2>&1 || [ -n "$$JAVA_HOME" ] || { \
	  echo "ERROR: Spark needs Java 17. Install it (Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless)" \
	       "or set JAVA_HOME, then re-run make."; exit 1; }

# The browser test of the Airflow plugin's page (tests/web) drives Debian's chromium through Playwright, which
# cannot download a browser of its own here: install it when it is missing and apt-get is there.
chromium-check:
	@command -v chromium >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  echo "installing Debian's chromium for the browser test"; \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	@command -v chromium >/dev/null 2>&1 || \
	  echo "WARNING: no chromium (and no apt-get to install it): tests/web/test_ledger_page.py will fail"

# The platform (make platform) keeps Airflow's metadata in PostgreSQL: install Debian's server when it is missing.
postgres-check:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || \
	  ! command -v apt-get >/dev/null 2>&1 || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  echo "installing Debian's postgresql for make platform"; \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }

# Idempotent: re-installs only when requirements.txt or pyproject.toml changed.
setup: java-check chromium-check postgres-check $(STAMP) $(JARS_STAMP) line-scan class-data
	@# Older set-ups wrote a .pth that changed os.environ in every Python process of the venv: remove it.
	@rm -f $(VENV)/lib/python*/site-packages/zz_sluice_airflow.pth
$(STAMP): requirements.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "ERROR: $(PYTHON) not found; sluice needs Python 3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	@# sluice's packages live in two folders (include/, tools/), so setuptools installs them through an import
	@# hook and says so with an "Editable installation" BuildBackendWarning: informational, silenced here.
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# Delta's connector and the s3a file system from Maven Central, each checked against its pinned sha256 into
# ~/.cache/sluice/jars (SLUICE_JARS_DIR); Spark starts offline after this.
$(JARS_STAMP): include/sluice/core/jars.lock $(STAMP)
	$(BIN)/python -m sluice.core.jars fetch
	touch $(JARS_STAMP)

# sluice's line reader (include/sluice/core/jvm/LineScan.java), compiled with the JDK's javac into the jar cache,
# once per source and PySpark (sluice.core.line_scan); without a javac, a note, and ingest runs without it.
line-scan: $(STAMP)
	@$(BIN)/python -m sluice.core.line_scan build

# The JVM's class-data archive of a sluice run, in the jar cache, once per checkout (keyed by Java, PySpark's
# install and the delta jars; a present one is kept): every later Spark start maps those classes.
class-data: $(STAMP) $(JARS_STAMP)
	@$(BIN)/python -m sluice.cli.class_data build

run: setup
	$(BIN)/sluice demo

# The suite runs on TEST_WORKERS processes (pytest-xdist), each with its own Spark session, AIRFLOW_HOME and S3
# server: most of a test's time is one JVM or Python process starting or waiting, so two workers keep both
# cores busy. TEST_WORKERS=0 runs it in this process. loadgroup hands out the longest tests first, and keeps the
# tests that share a module's fixture on one worker (tests/support/scheduling.py).
TEST_WORKERS ?= 2
test: setup
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup

test-fast: setup
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not slow"

lint: setup
	$(BIN)/ruff check include tools tests dags jobs plugins bench pipelines
	$(BIN)/mypy

# The production topology on 127.0.0.1 (README, "The platform"): PostgreSQL, an S3 server holding the landing
# zone and the lake, a Spark master and 2 workers, Airflow's api-server, scheduler and dag-processor, all under
# PLATFORM_DIR. platform-down stops, by pid, what platform started.
# PLATFORM_ARGS=--no-schedules: the scheduler runs only triggered and backfill runs.
PLATFORM_DIR ?= $(CURDIR)/.platform
PLATFORM_ARGS ?=
platform: setup
	$(BIN)/python -m sluice.platform up --root $(PLATFORM_DIR) $(PLATFORM_ARGS)

platform-down:
	$(BIN)/python -m sluice.platform down --root $(PLATFORM_DIR)

# A generated day (DEMO_HOURS) landed in the bucket in parts, each followed by DAG runs through the scheduler,
# then an Airflow backfill and a late file that corrects a closed window; ends with make run's summary.
DEMO_HOURS ?= 24
DEMO_SLICES ?= 4
platform-demo: setup
	$(BIN)/python -m sluice_tools.platform_demo --root $(PLATFORM_DIR) --hours $(DEMO_HOURS) --slices $(DEMO_SLICES)

bench: setup
	$(BIN)/python bench/run.py $(ARGS)

# sluice beside the bare Spark job on make platform's 2-worker cluster, 1M and 10M events, landing and lake on
# S3 (bench/cluster.py; starts the platform when it is not running). ARGS: e.g. --sizes 20000,200000.
bench-cluster: platform
	$(BIN)/python bench/cluster.py --platform-dir $(PLATFORM_DIR) $(ARGS)

bench-smoke: setup
	$(BIN)/python bench/run.py --smoke

# The Airflow UI with sluice's DAGs on http://127.0.0.1:8080, from any shell (sluice/airflow/standalone.py): what
# `airflow standalone` starts (SQLite, LocalExecutor) in AIRFLOW_HOME (default $(SLUICE_HOME)/airflow), with their
# logs in $AIRFLOW_HOME/standalone/logs. Every start prints the URL, the user and the file holding the password.
# Ctrl-C stops it all; if one component exits, the rest are stopped and the target fails with one line naming it.
# Nothing listens beyond 127.0.0.1 unless asked: AIRFLOW_HOST=0.0.0.0 make airflow opens the UI and the REST API
# (which can trigger DAGs) to the network; AIRFLOW_PORT=8081 make airflow moves it. Tasks run up to the CPU count
# at once (AIRFLOW__CORE__PARALLELISM), their Spark drivers on SPARK_LOCAL_IP=127.0.0.1; set either to change it.
airflow: setup
	$(BIN)/python -m sluice.airflow.standalone

clean:
	rm -rf .sluice .pytest_cache .mypy_cache .ruff_cache
