"""Benchmark settings: a project of django-delayq and the benchmark's handlers.

Like the Django-based peers' (``benchmarks/peer_settings.py``), the project
holds only the queue and its handlers, so that start-up figures compare the
queues, not the apps around them; every app a real project adds costs each
of them the same. ``BENCH_ADMIN=1`` adds Django's admin and what it needs
(``benchmarks/admin_1m.py``).

``BENCH_DATABASE_URL`` (set by the benchmark runner) wins over
``DATABASE_URL``; ``BENCH_DEFAULTS=1`` leaves ``DELAYQ`` empty (the pickup
rows: every setting at its default); ``BENCH_DEBUG=1`` turns on ``DEBUG`` (the memory
measurement runs the worker with Django's query log on);
``BENCH_SEARCH_INDEXES=1`` installs ``django_delayq.contrib.search_indexes``.
"""

import os

import environ

SECRET_KEY = "benchmarks-only"
DEBUG = os.environ.get("BENCH_DEBUG") == "1"
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
env = environ.Env()
DATABASES = {
    "default": env.db_url_config(
        os.environ.get("BENCH_DATABASE_URL")
        or os.environ.get("DATABASE_URL")
        or "postgres://postgres@127.0.0.1:5432/delayq_bench"
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Worker processes share the file: WAL, and writers that wait for each other.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
INSTALLED_APPS = ["django_delayq", "benchmarks.benchapp"]
if os.environ.get("BENCH_ADMIN") == "1":
    # The test suite's admin set-up: its apps, middleware, templates and URLs.
    from tests import settings as _tests

    MIDDLEWARE, TEMPLATES = _tests.MIDDLEWARE, _tests.TEMPLATES
    ROOT_URLCONF, STATIC_URL = _tests.ROOT_URLCONF, _tests.STATIC_URL
    INSTALLED_APPS = [
        *(app for app in _tests.INSTALLED_APPS if app.startswith("django.contrib.")),
        *INSTALLED_APPS,
    ]
if os.environ.get("BENCH_SEARCH_INDEXES") == "1":
    # benchmarks/admin_1m.py: the opt-in search indexes, built or dropped by migrate.
    INSTALLED_APPS.append("django_delayq.contrib.search_indexes")
DELAYQ = {"POLL_INTERVAL": 1, "PRUNE_INTERVAL": None}
if os.environ.get("BENCH_DEFAULTS") == "1":
    # The pickup rows (common.measure_latency): the worker as a user runs it.
    DELAYQ = {}
if os.environ.get("BENCH_CLAIM_DELAY"):
    # `python -m benchmarks.systems.delayq cpu --samples`: the trade-off of
    # CLAIM_DELAY (seconds, or "none"), CPU against pickup under a steady load.
    _delay = os.environ["BENCH_CLAIM_DELAY"]
    DELAYQ["CLAIM_DELAY"] = None if _delay == "none" else float(_delay)
if os.environ.get("BENCH_ACK_DELAY"):
    # The same trade-off for ACK_DELAY (seconds, or "none"): fewer commits
    # per message against a longer window of redelivery after a kill.
    _delay = os.environ["BENCH_ACK_DELAY"]
    DELAYQ["ACK_DELAY"] = None if _delay == "none" else float(_delay)
if os.environ.get("BENCH_SOAK_RETENTION"):
    # benchmarks/soak.py: pruning on, with a retention short enough to reach.
    DELAYQ = {"RETENTION": float(os.environ["BENCH_SOAK_RETENTION"]), "PRUNE_INTERVAL": 30}
LOGGING = {"version": 1}

if os.environ.get("BENCH_PREPARED") == "1":
    # What a deployment without a transaction-mode pooler can turn on:
    # server-side parameters and psycopg's prepared statements.
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "server_side_binding": True,
        "prepare_threshold": 5,
    }
