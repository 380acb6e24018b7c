"""Benchmark settings: the test settings plus a no-op handler app.

``BENCH_DATABASE_URL`` (set by the benchmark runner) wins over
``DATABASE_URL``; ``BENCH_DEBUG=1`` turns on ``DEBUG`` (the memory
measurement runs the worker with Django's query log on).
"""

import os

if os.environ.get("BENCH_DATABASE_URL"):
    os.environ["DATABASE_URL"] = os.environ["BENCH_DATABASE_URL"]

from tests.settings import *  # noqa: E402, F403

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.benchapp"]  # noqa: F405
DELAYQ = {"POLL_INTERVAL": 1, "PRUNE_INTERVAL": None}
LOGGING = {"version": 1}
DEBUG = os.environ.get("BENCH_DEBUG") == "1"
