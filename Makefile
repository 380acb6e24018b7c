# The README's two commands are `make demo` and `make test`; the logic lives
# in scripts/dev.sh so that a machine without make can run it directly.

.PHONY: venv test demo suite screenshots bench-admin bench-pipeline

venv:
	scripts/dev.sh venv

test:
	scripts/dev.sh test

# The suite only, without reinstalling (for quick iterations).
suite:
	scripts/dev.sh suite

demo:
	scripts/dev.sh demo

bench-admin: ; .venv/bin/python -m benchmarks.admin_1m $(ARGS)  # 1M rows on PostgreSQL: admin page times
bench-pipeline: ; .venv/bin/python -m benchmarks.pipeline_1m $(ARGS)  # Spark enqueue/archive/report of 1M rows

# The README's admin pictures, taken by the browser tests (SQLite, no server needed).
screenshots:
	DELAYQ_SCREENSHOTS=docs/screenshots DATABASE_URL=sqlite:///$${TMPDIR:-/tmp}/delayq-shots.sqlite3 \
		.venv/bin/pytest -q tests/browser
