"""Settings for the test suite: the database comes from DATABASE_URL.

Worker subprocesses started by the tests import these same settings and are
pointed at the test database through DELAYQ_TEST_DATABASE_NAME.
"""

import importlib.util
import json
import os
import tempfile
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = "tests-only-not-secret"
# Django's own advice for test suites: a fast hasher. The default (PBKDF2,
# a million rounds) spent a quarter of a CPU second on every user the admin
# tests create, minutes of every leg.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_sqlite_path = os.path.join(tempfile.gettempdir(), f"delayq-tests-{os.getuid()}.sqlite3")
DATABASES = {
    "default": env.db_url_config(os.environ.get("DATABASE_URL") or f"sqlite:///{_sqlite_path}")
}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not :memory:, so worker subprocesses and threads share it; WAL
    # and IMMEDIATE transactions so concurrent writers wait instead of failing.
    _db.setdefault("TEST", {})["NAME"] = _db["NAME"].replace(".sqlite3", "") + "-test.sqlite3"
    _db["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
if _db["ENGINE"] == "django.db.backends.mysql":
    # A session time zone that is not UTC, so that every test proves the
    # database clock (clock.sql_now) is read in UTC, as Django stores it.
    _db["OPTIONS"] = {"charset": "utf8mb4", "init_command": "SET time_zone = '+05:00'"}
    _db.setdefault("TEST", {}).update({"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"})
if _db["ENGINE"] == "django.db.backends.postgresql" and os.environ.get("DELAYQ_TEST_PREPARED"):
    # The configuration the README recommends for speed: server-side
    # parameters and psycopg's prepared statements (DELAYQ_TEST_PREPARED=1).
    _db["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 0}
if os.environ.get("DELAYQ_TEST_DIRECT_URL"):
    # DATABASE_URL goes through a pooler (PgBouncer in transaction mode):
    # "direct" reaches the same database without it, for the workers' LISTEN
    # and for the tests that need a session of their own (pg_terminate_backend).
    DATABASES["direct"] = env.db_url_config(os.environ["DELAYQ_TEST_DIRECT_URL"])
    DATABASES["direct"]["TEST"] = {"MIRROR": "default"}
if os.environ.get("DELAYQ_TEST_DATABASE_NAME"):
    _db["NAME"] = os.environ["DELAYQ_TEST_DATABASE_NAME"]
    if "direct" in DATABASES:
        DATABASES["direct"]["NAME"] = _db["NAME"]
# The queue on its own database: DELAYQ_TEST_QUEUE_URL adds the alias "queue"
# (same engine options as default), DELAYQ["DATABASE"] and the router below.
if os.environ.get("DELAYQ_TEST_QUEUE_URL"):
    _queue_db = env.db_url_config(os.environ["DELAYQ_TEST_QUEUE_URL"])
    if _queue_db["ENGINE"] == _db["ENGINE"]:
        _queue_db["OPTIONS"] = dict(_db.get("OPTIONS", {}))
        _queue_db.setdefault("TEST", {}).update(
            {k: v for k, v in _db.get("TEST", {}).items() if k != "NAME"}
        )
    if _queue_db["ENGINE"] == "django.db.backends.sqlite3":
        _queue_db.setdefault("TEST", {})["NAME"] = (
            _queue_db["NAME"].replace(".sqlite3", "") + "-test.sqlite3"
        )
    if os.environ.get("DELAYQ_TEST_QUEUE_DATABASE_NAME"):
        _queue_db["NAME"] = os.environ["DELAYQ_TEST_QUEUE_DATABASE_NAME"]
    DATABASES["queue"] = _queue_db
    DATABASE_ROUTERS = ["django_delayq.routers.DelayQRouter"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_delayq",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DELAYQ = {
    "POLL_INTERVAL": 1,
    "RETRY_POLICY": "django_delayq.retry.FixedDelay",
    "SHUTDOWN_GRACE": 10,
}
if "direct" in DATABASES:
    # DELAYQ_TEST_LISTEN_DATABASE="" makes a worker LISTEN through the pooler.
    DELAYQ["LISTEN_DATABASE"] = os.environ.get("DELAYQ_TEST_LISTEN_DATABASE", "direct") or None
if "queue" in DATABASES:
    DELAYQ["DATABASE"] = "queue"
if os.environ.get("DELAYQ_TEST_LEASE"):
    DELAYQ["LEASE"] = float(os.environ["DELAYQ_TEST_LEASE"])
if os.environ.get("DELAYQ_TEST_POLL"):
    DELAYQ["POLL_INTERVAL"] = float(os.environ["DELAYQ_TEST_POLL"])
if os.environ.get("DELAYQ_TEST_GRACE"):
    DELAYQ["SHUTDOWN_GRACE"] = float(os.environ["DELAYQ_TEST_GRACE"])
if os.environ.get("DELAYQ_TEST_HEARTBEAT"):
    DELAYQ["HEARTBEAT_INTERVAL"] = float(os.environ["DELAYQ_TEST_HEARTBEAT"])
if os.environ.get("DELAYQ_TEST_DEAD_AFTER"):
    DELAYQ["WORKER_DEAD_AFTER"] = float(os.environ["DELAYQ_TEST_DEAD_AFTER"])
# Cron schedules for worker subprocesses, as JSON: {"name": {"every": 2, "queue": "ticks"}}.
if os.environ.get("DELAYQ_TEST_QUEUES"):
    DELAYQ["QUEUES"] = json.loads(os.environ["DELAYQ_TEST_QUEUES"])
if os.environ.get("DELAYQ_TEST_SCHEDULES"):
    DELAYQ["SCHEDULES"] = json.loads(os.environ["DELAYQ_TEST_SCHEDULES"])
if os.environ.get("DELAYQ_TEST_CRON_INSTALL_INTERVAL"):
    DELAYQ["CRON_INSTALL_INTERVAL"] = float(os.environ["DELAYQ_TEST_CRON_INSTALL_INTERVAL"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_delayq": {
            "handlers": ["console"],
            "level": os.environ.get("DELAYQ_LOG_LEVEL", "WARNING"),
        }
    },
}
# Timestamped worker logs (the chaos run's post-mortems).
if os.environ.get("DELAYQ_LOG_TIMES"):
    LOGGING["formatters"] = {"timed": {"format": "%(asctime)s %(process)d %(message)s"}}
    LOGGING["handlers"]["console"]["formatter"] = "timed"  # type: ignore[index]

# Django's Tasks framework (django.tasks on Django 6, the django-tasks backport
# on 5.2) through DelayQBackend; the suite's tasks are in tests/testapp/tasks.py.
if importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks"):
    if not importlib.util.find_spec("django.tasks"):
        INSTALLED_APPS.append("django_tasks")
    TASKS = {
        "default": {
            "BACKEND": "django_delayq.backends.DelayQBackend",
            "QUEUES": ["default", "emails"],
            # Ordered groups: the steps of one account run one at a time, in order.
            "OPTIONS": {
                "GROUP_BY": {
                    "tests.testapp.tasks.account_step": "account",
                    "tests.testapp.tasks.tenant_event": "tenant",
                }
            },
        },
        "retrying": {
            "BACKEND": "django_delayq.backends.DelayQBackend",
            "QUEUES": ["tasks-retry"],
            "OPTIONS": {"MAX_ATTEMPTS": 2},
        },
    }
    # The framework logs from its own receivers of the task signals: worker
    # subprocesses print them, so the tests see the signals sent there.
    _tasks_logger = {
        "handlers": ["console"],
        "level": os.environ.get("DELAYQ_LOG_LEVEL", "WARNING"),
    }
    LOGGING["loggers"] = {
        "django.tasks": _tasks_logger,  # Django 6
        "django_tasks": _tasks_logger,  # the backport
        **LOGGING["loggers"],  # type: ignore[dict-item]
    }

# A project that has not configured its logging (what run_delayq shows then).
if os.environ.get("DELAYQ_TEST_NO_LOGGING"):
    LOGGING = {}

# A module of the project's that a test edits (run_delayq --reload).
if os.environ.get("DELAYQ_TEST_IMPORT"):
    importlib.import_module(os.environ["DELAYQ_TEST_IMPORT"])
