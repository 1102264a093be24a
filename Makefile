# deltadrain: `make demo` and `make test` are the two commands a fresh machine needs.
SHELL := /bin/bash
VENV  := .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed
JARS  := .cache/jars
# mypy's cache of what it inferred, per user: a fresh clone re-checks only the files that differ from what
# it last checked (its cache compares contents), ~2 s instead of ~30 s of CPU.
export MYPY_CACHE_DIR ?= $(HOME)/.cache/deltadrain/mypy
SPARK_MODULES := jvm/logstore/pom.xml $(wildcard jvm/logstore/src/main/java/dev/deltadrain/storage/*.java) \
             jvm/connect/pom.xml $(wildcard jvm/connect/src/main/java/dev/deltadrain/connect/*.java)
S3_LOG_STORE := jvm/s3logstore/pom.xml $(wildcard jvm/s3logstore/src/main/java/dev/deltadrain/storage/*.java)
REGISTRY := jvm/registry/pom.xml jvm/registry/src/main/resources/application.properties

.PHONY: install venv jars proto jvm-archive browser tls-terminator cdc-database demo demo-cdc test test-fast lint bench lock services-down clean

install: venv $(STAMP) jars jvm-archive

# A .venv of another Python version (or a broken one) is made anew; its stamp goes with it, so
# the install below runs again. That needs `venv` done before make looks at the stamp: serial.
.NOTPARALLEL:
venv:
	@PY=$$(scripts/check-prereqs) && scripts/ensure-venv "$$PY" $(VENV)

# Python 3.11, Java 17 and Maven are checked first; everything else is installed here.
$(STAMP): requirements.txt constraints.txt pyproject.toml
	@PY=$$(scripts/check-prereqs) && scripts/ensure-venv "$$PY" $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt -c constraints.txt
	$(BIN)/pip install -q --no-deps -e .
	@touch $(STAMP)

jars: $(JARS)/spark/.complete $(JARS)/kafka/.complete $(JARS)/debezium/.complete $(JARS)/s3/.complete $(JARS)/s3a/.complete $(JARS)/registry/.complete

# Fetched with mvn from jvm/spark and jvm/kafka; the spark kind also gets the log store built from jvm/logstore
# and the Connect server's entry point built from jvm/connect.
$(JARS)/spark/.complete $(JARS)/kafka/.complete &: jvm/spark/pom.xml jvm/kafka/pom.xml $(SPARK_MODULES) | $(STAMP)
	$(BIN)/deltadrain jars --only spark,kafka

# Kafka Connect's worker with Debezium's Postgres connector (jvm/debezium): the change-data-capture service.
$(JARS)/debezium/.complete: jvm/debezium/pom.xml | $(STAMP)
	$(BIN)/deltadrain jars --only debezium

# The embedded S3 server (jvm/s3) and hadoop-aws with the AWS SDK bundle (jvm/s3a, ~620 MB), which
# the s3a kind keeps with the S3 log store built from jvm/s3logstore (docs/object-store.md).
$(JARS)/s3/.complete $(JARS)/s3a/.complete &: jvm/s3/pom.xml jvm/s3a/pom.xml $(S3_LOG_STORE) | $(STAMP)
	$(BIN)/deltadrain jars --only s3,s3a

# The embedded schema registry (jvm/registry): Apicurio Registry built as a Quarkus app (~130 MB), once
# per change of its pom or configuration (docs/config.md, "Schema registry").
$(JARS)/registry/.complete: $(REGISTRY) | $(STAMP)
	$(BIN)/deltadrain jars --only registry

# The Spark driver's class-data archive, made from a small real drain (private Valkey, throwaway lake):
# drivers start ~4 s sooner. A no-op while the JDK and jars are unchanged; a failure only warns.
jvm-archive: jars
	$(BIN)/deltadrain jvm-archive --optional

# Headless Chromium (Debian's package) for the view's browser test; a no-op when it is installed.
browser:
	@scripts/ensure-chromium

# stunnel (Debian's package), the TLS terminator of the embedded Valkey's TLS port; a no-op when installed.
tls-terminator:
	@scripts/ensure-stunnel

# PostgreSQL (Debian's package), the embedded change-data-capture database; a no-op when it is installed.
cdc-database:
	@scripts/ensure-postgres

# Installs, starts Valkey, Kafka and Airflow, produces sample events, ingests them, prints where to look.
# The demo reads no Valkey over TLS: without stunnel (and root to install it) it only says so.
demo: install
	-@scripts/ensure-stunnel
	$(BIN)/deltadrain demo

# Change data capture: PostgreSQL changes through Debezium and Kafka into upsert targets (docs/cdc.md).
demo-cdc: install cdc-database
	$(BIN)/deltadrain --config config/pipelines.cdc.yaml demo --cdc

# The whole suite, slow end-to-end tests included (CI runs exactly this), on three workers: each has
# its own services, Spark session and Airflow DB (tests/conftest.py). Its tests also wait (JVMs starting,
# Airflow's scheduler, timeouts); with three workers a 2-core machine is kept busy (docs/testing.md,
# "Where the time goes"). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 3
test: install browser tls-terminator cdc-database
	$(BIN)/ruff check .
	$(BIN)/mypy
	DELTADRAIN_REQUIRE_ALL_TESTS=1 $(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal

# The quick loop while developing: skips the slow end-to-end tests.
test-fast: install
	$(BIN)/pytest -m "not slow"

# The example's Protobuf descriptor set, from its .proto (tests/unit/test_protobuf.py checks they agree).
proto: venv $(STAMP)
	cd config/schemas && $(CURDIR)/$(BIN)/python -m grpc_tools.protoc -I. --include_imports \
		--descriptor_set_out=clicks.desc clicks.proto

# ruff, then mypy on include/deltadrain (its settings: pyproject.toml, [tool.mypy]).
lint: venv $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: install
	$(BIN)/deltadrain bench

# Re-lock constraints.txt after changing a pin in requirements.txt.
lock: venv $(STAMP)
	{ sed -n '1,2p' constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -v '^deltadrain'; } > constraints.tmp
	mv constraints.tmp constraints.txt

services-down:
	-$(BIN)/deltadrain services down

# .deltadrain holds the services' data (unacknowledged messages too) and, unless data_dir points
# elsewhere, every Delta table: a plain `make clean` says so and deletes nothing.
clean:
	@if [ "$(CONFIRM)" != "1" ]; then \
	  echo "make clean deletes .deltadrain: the embedded services' data and, unless the config's data_dir"; \
	  echo "points elsewhere, every Delta table (targets, dead letters, metrics). To go on: make clean CONFIRM=1"; \
	  exit 2; fi
	-$(BIN)/deltadrain services down
	rm -rf .deltadrain
