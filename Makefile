# duetime: `make run` to try it, `make test` to test it. See README.md.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run up down test long fuzz conformance lint typecheck openapi bench bench-import bench-search bench-filtered-cancel spark-s3a faults setup cluster-up cluster-down clean

run:            ## install what is missing, start everything, stay in the foreground
	@devstack/stack.sh run

up:             ## same as run, but return once ready and leave it in the background
	@devstack/stack.sh up

down:           ## stop every stack's API and releaser and every local Cassandra node
	@devstack/stack.sh down

setup:          ## venv, Cassandra, schema
	@devstack/stack.sh setup

test:           ## the whole suite against the real Cassandra node (and Chromium for the dashboard)
	@devstack/stack.sh setup-test
	$(PY) -m pytest $(PYTEST_ARGS)

long: setup     ## the suite's largest tests at full scale: 100,000-message restore, import and campaign cancel (about 20 min on 2 cores)
	DUETIME_LONG=1 $(PY) -m pytest -m long_form $(PYTEST_ARGS)

fuzz: setup     ## schemathesis over every route with 500 examples each (the suite runs 10)
	DUETIME_FUZZ_EXAMPLES=$${DUETIME_FUZZ_EXAMPLES:-500} $(PY) -m pytest tests/test_fuzz.py $(PYTEST_ARGS)

conformance: setup  ## the schemathesis CLI as its users run it (every check, --seed 1, 30 examples an operation, no hooks; test data in devstack/schemathesis.toml) against an API and releaser of its own
	@devstack/conformance.sh

faults: setup   ## the fault suite's long form: each nemesis, then all combined, on 2,000 messages a round; table in bench-results/faults.md
	$(PY) -m tests.faults.run $${FAULTS_MESSAGES:-2000} $${FAULTS_WINDOW_S:-30}

lint:
	$(VENV)/bin/ruff check app workers spark tests devstack clients
	$(VENV)/bin/mypy

openapi: setup  ## regenerate openapi.yaml from the marshmallow schemas
	$(VENV)/bin/duetime-admin openapi --output openapi.yaml

bench: up       ## pull (batched and one message per request), push, push in a crowded keyspace, pull beside idle backlogs, campaign, schedule, many-topic, idle-stack, new-topic, overload, long-poll, frequency-cap and command-line start benchmarks against the running stack; results in bench-results/
	$(PY) -m tests.bench.run $(BENCH_ARGS)
	$(PY) -m tests.bench.single $(BENCH_SINGLE_ARGS)
	$(PY) -m tests.bench.push
	$(PY) -m tests.bench.crowded $(BENCH_CROWDED_ARGS)
	$(PY) -m tests.bench.backlogs $(BENCH_BACKLOG_ARGS)
	$(PY) -m tests.bench.campaigns $(BENCH_CAMPAIGN_ARGS)
	$(PY) -m tests.bench.schedules $(BENCH_SCHEDULE_ARGS)
	$(PY) -m tests.bench.topics $(BENCH_TOPIC_ARGS)
	$(PY) -m tests.bench.idle $(BENCH_IDLE_ARGS)
	$(PY) -m tests.bench.new_topics $(BENCH_NEW_TOPIC_ARGS)
	$(PY) -m tests.bench.overload $(BENCH_OVERLOAD_ARGS)
	$(PY) -m tests.bench.long_polls $(BENCH_LONG_POLL_ARGS)
	$(PY) -m tests.bench.frequency_caps $(BENCH_CAP_ARGS)
	$(PY) -m tests.bench.cli_start

bench-import: up  ## Spark import of 1,000,000 rows vs HTTP batch vs raw inserts (about 10 min)
	$(PY) -m tests.bench.spark_import

bench-search: setup  ## search of a topic of BENCH_SEARCH_ARGS messages (1,000,000) by label and by recipient, first page p50/p99, and the indexes' write cost; an API of its own on port 8097 (loading a million takes many minutes)
	$(PY) -m tests.bench.search $(BENCH_SEARCH_ARGS)

bench-filtered-cancel: setup  ## a cancel of the BENCH_FILTERED_ARGS messages (100,000) a label matches, beside a tenth as many it leaves: messages/s and the raw conditional-batch ceiling; an API of its own on port 8098 (a few minutes)
	$(PY) -m tests.bench.filtered_cancel $(BENCH_FILTERED_ARGS)

spark-s3a:      ## opt-in: hadoop-aws 3.3.4 and its AWS SDK bundle (~280 MB) into var/spark/jars, for s3a:// URLs in `duetime-admin spark`
	mvn -B -q -f devstack/spark-s3a-pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	  -DoutputDirectory=var/spark/jars

cluster-up:     ## the 3-node cluster on 127.0.0.1-3 (CQL port 9043)
	python3 devstack/cassandra.py start cluster

cluster-down:
	python3 devstack/cassandra.py stop cluster

clean: down
	rm -rf var/cassandra/dev var/cassandra/c1 var/cassandra/c2 var/cassandra/c3 var/cassandra/solo var/log
