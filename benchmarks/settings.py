"""Benchmark settings: the test settings plus a no-op handler app."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.benchapp"]  # noqa: F405
DELAYQ = {"POLL_INTERVAL": 1, "PRUNE_INTERVAL": None}
LOGGING = {"version": 1}
