# The README's two commands are `make demo` and `make test`; the logic lives
# in scripts/dev.sh so that a machine without make can run it directly.

.PHONY: venv test demo suite django6 screenshots bench-admin bench-pipeline chaos

venv:
	scripts/dev.sh venv

test:
	scripts/dev.sh test

# The suite only, without reinstalling (for quick iterations).
suite:
	scripts/dev.sh suite

demo:
	scripts/dev.sh demo

# The matrix's Python 3.12 + Django 6.x leg alone (make test runs it after the suite).
django6:
	scripts/dev.sh django6

# Reliability proof on PostgreSQL: 4 producers x 4 consumers, 20,000 messages,
# SIGKILLs, a SIGTERM restart, every connection terminated once; prints the
# figures and fails on any violated invariant. ARGS="--messages 2000" etc.;
# CHAOS_DATABASE_URL picks the (dedicated) database, default delayq_chaos.
chaos: ; .venv/bin/python -m tests.chaos.harness $(ARGS)

# Side by side with the physical limit and the peers (benchmarks/bench.py):
# 30-45 minutes (the 100,000-message memory runs of the slower peers take most
# of it); `make bench ARGS=--quick` takes about 6 minutes.
bench:
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/python -m pip install -q -e '.[bench,test]'
	.venv/bin/python -m benchmarks.bench $(ARGS)

bench-admin: ; .venv/bin/python -m benchmarks.admin_1m $(ARGS)  # 1M rows on PostgreSQL: admin page times
bench-pipeline: ; .venv/bin/python -m benchmarks.pipeline_1m $(ARGS)  # Spark enqueue/archive/report of 1M rows

# The README's admin pictures, taken by the browser tests (SQLite, no server needed).
screenshots:
	DELAYQ_SCREENSHOTS=docs/screenshots DATABASE_URL=sqlite:///$${TMPDIR:-/tmp}/delayq-shots.sqlite3 \
		.venv/bin/pytest -q tests/browser
