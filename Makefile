# The README's two commands are `make demo` and `make test`; the logic lives
# in scripts/dev.sh so that a machine without make can run it directly.

.PHONY: venv test test-quick coverage demo dist docs suite django6 screenshots bench bench-pressure bench-history bench-admin bench-startup bench-pipeline bench-flow chaos adversaries soak

venv:
	scripts/dev.sh venv

test:
	scripts/dev.sh test

# The inner loop: PostgreSQL and SQLite side by side, without the browser, the
# Spark pipeline, the run_delayq processes, the fault injection and the docs;
# about 2.5 minutes.
test-quick:
	scripts/dev.sh quick

# Branch coverage of django_delayq over the PostgreSQL, SQLite and MariaDB legs
# (every process counted), about 12 minutes; COVERAGE_LEGS=full runs the whole
# suite on every database.
coverage:
	scripts/dev.sh coverage

# The suite only, without reinstalling (for quick iterations).
suite:
	scripts/dev.sh suite

# Installs only what the example project needs (Django, the app, django-environ,
# django-tasks on Django 5.2): no Spark, browser, linters or MariaDB driver.
demo:
	scripts/dev.sh demo

# The sdist and the wheel in dist/, checked (twine check, contents, a fresh
# install of the wheel); make test runs it too.
dist:
	scripts/dev.sh dist

# The documentation site (Sphinx + MyST, Furo) in docs/_build/html; warnings are
# errors, links inside the site are checked, the references are generated from
# the code. make test builds it too (and runs its examples with the suite).
docs:
	scripts/dev.sh docs

# The matrix's Python 3.12 + Django 6.x leg alone (make test runs it after the suite).
django6:
	scripts/dev.sh django6

# Reliability proof on PostgreSQL: 4 producers x 4 consumers, 20,000 messages,
# SIGKILLs, a SIGTERM restart, every connection terminated once; prints the
# figures and fails on any violated invariant. ARGS="--messages 2000" etc.;
# CHAOS_DATABASE_URL picks the (dedicated) database, default delayq_chaos.
# Then the full adversary run (tests/chaos/adversaries.py) on the same database:
# lock-holding producers, raising callbacks, skewed-clock operators, 100,000
# ordered groups... ADVERSARY_ARGS="--groups 20000"; `make adversaries` alone,
# ADVERSARY_DATABASE_URL for SQLite or MariaDB.
chaos:
	.venv/bin/python -m tests.chaos.harness $(ARGS)
	.venv/bin/python -m tests.chaos.adversaries $(ADVERSARY_ARGS)
adversaries: ; .venv/bin/python -m tests.chaos.adversaries $(ADVERSARY_ARGS)

# Side by side with the physical limit and the peers (benchmarks/bench.py):
# about two hours (short metrics run three times, the 100,000-message memory
# runs of the slower peers take long; the everyday-cost rows, CPU at 20, 200
# and 1,000 msg/s, idle CPU and start-up, add about an hour, in rounds too);
# `make bench ARGS=--quick` takes about 35 minutes, 25 of them for those rows. The PostgreSQL server is BENCH_POSTGRES, or the one
# scripts/ensure-postgres.sh finds or starts (as for the tests).
bench:
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/python -m pip install -q -e '.[bench,test]'
	BENCH_POSTGRES="$${BENCH_POSTGRES:-$$(scripts/ensure-postgres.sh | sed 's#/[^/]*$$##')}" \
		.venv/bin/python -m benchmarks.bench $(ARGS)

# Table health: one hour at 200 messages/s, pruned after 5 minutes; samples
# dead tuples and sizes every minute (benchmarks/soak.py). ARGS="--minutes 10".
# Autovacuum decides the outcome, so it runs on a throwaway cluster with
# PostgreSQL's default configuration (.pgdata-soak, port 54330; stop it with
# `PGDATA_DIR=.pgdata-soak scripts/ensure-postgres.sh stop`) unless
# BENCH_POSTGRES names a server.
SOAK_CLUSTER = DATABASE_URL= DELAYQ_PG_PROBE_PORT=1 DELAYQ_PG_DEFAULTS=1 \
	PGDATA_DIR=$(CURDIR)/.pgdata-soak PGPORT_LOCAL=54330
soak:
	BENCH_POSTGRES="$${BENCH_POSTGRES:-$$($(SOAK_CLUSTER) scripts/ensure-postgres.sh | sed 's#/[^/]*$$##')}" \
		.venv/bin/python -m benchmarks.soak $(ARGS)

# The queues under database pressure, beside procrastinate and PGQueuer
# (benchmarks/pressure.py): a steady 100 messages/s through clean -> pressure
# -> recovery, for a transaction holding the vacuum horizon, four REPEATABLE
# READ readers, and 1.5x overload; on a cluster of its own with default
# settings (.pgdata-pressure, port 54331; stop it with
# `PGDATA_DIR=.pgdata-pressure scripts/ensure-postgres.sh stop`). About 2.5 h
# at full phases (2, 10, 3 min); ARGS="--phases 30,60,30" for a quick look.
bench-pressure:
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/python -m pip install -q -e '.[bench,test]'
	.venv/bin/python -m benchmarks.pressure $(ARGS)

bench-admin: ; .venv/bin/python -m benchmarks.admin_1m $(ARGS)  # 1M rows on PostgreSQL: admin page times

# What ten million finished messages kept for retention cost (benchmarks/history.py):
# enqueue, claim, start-up, delayq_status and the admin beside an empty
# installation, then retention removing them all under a probe, on the
# pressure benchmark's own cluster. About 20 minutes; ARGS="--rows 1000000".
bench-history:
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/python -m pip install -q -e '.[bench,test]'
	.venv/bin/python -m benchmarks.history $(ARGS)

# What flow control costs (benchmarks/flow.py): draining with and without a
# rate limit, a concurrency cap or ordered groups; one claim's time beside a
# 100,000-message backlog held behind a blocked group or in a throttled queue;
# the claims' plans. About 15 minutes on 2 cores; ARGS="--messages 2000
# --repeat 1" for a quick look. Writes benchmarks/results/flow-<date>.json/.md.
bench-flow:
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/python -m pip install -q -e '.[bench,test]'
	BENCH_POSTGRES="$${BENCH_POSTGRES:-$$(scripts/ensure-postgres.sh | sed 's#/[^/]*$$##')}" \
		.venv/bin/python -m benchmarks.flow $(ARGS)
# Where a worker's start-up goes (Python, psycopg, Django, django-delayq), beside
# procrastinate standalone and through its Django integration (benchmarks/startup.py).
bench-startup: ; .venv/bin/python -m benchmarks.startup $(ARGS)
bench-pipeline: ; .venv/bin/python -m benchmarks.pipeline_1m $(ARGS)  # Spark enqueue/archive/report of 1M rows

# The README's admin pictures, taken by the browser tests (SQLite, no server needed).
screenshots:
	DELAYQ_SCREENSHOTS=docs/screenshots DATABASE_URL=sqlite:///$${TMPDIR:-/tmp}/delayq-shots.sqlite3 \
		.venv/bin/pytest -q tests/browser
