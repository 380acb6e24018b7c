"""Benchmark settings: the test settings plus a no-op handler app.

``BENCH_DATABASE_URL`` (set by the benchmark runner) wins over
``DATABASE_URL``; ``BENCH_DEBUG=1`` turns on ``DEBUG`` (the memory
measurement runs the worker with Django's query log on);
``BENCH_SEARCH_INDEXES=1`` installs ``django_delayq.contrib.search_indexes``.
"""

import os

if os.environ.get("BENCH_DATABASE_URL"):
    os.environ["DATABASE_URL"] = os.environ["BENCH_DATABASE_URL"]

from tests.settings import *  # noqa: E402, F403

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.benchapp"]  # noqa: F405
if os.environ.get("BENCH_SEARCH_INDEXES") == "1":
    # benchmarks/admin_1m.py: the opt-in search indexes, built or dropped by migrate.
    INSTALLED_APPS.append("django_delayq.contrib.search_indexes")
DELAYQ = {"POLL_INTERVAL": 1, "PRUNE_INTERVAL": None}
if os.environ.get("BENCH_SOAK_RETENTION"):
    # benchmarks/soak.py: pruning on, with a retention short enough to reach.
    DELAYQ = {"RETENTION": float(os.environ["BENCH_SOAK_RETENTION"]), "PRUNE_INTERVAL": 30}
LOGGING = {"version": 1}
DEBUG = os.environ.get("BENCH_DEBUG") == "1"

if os.environ.get("BENCH_PREPARED") == "1":
    # What a deployment without a transaction-mode pooler can turn on:
    # server-side parameters and psycopg's prepared statements.
    DATABASES["default"]["OPTIONS"] = {  # noqa: F405
        **DATABASES["default"].get("OPTIONS", {}),  # noqa: F405
        "server_side_binding": True,
        "prepare_threshold": 5,
    }
