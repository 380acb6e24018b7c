"""Settings for the test suite: the database comes from DATABASE_URL.

Worker subprocesses started by the tests import these same settings and are
pointed at the test database through DELAYQ_TEST_DATABASE_NAME.
"""

import json
import os
import tempfile
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = "tests-only-not-secret"
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
if os.environ.get("DELAYQ_TEST_DATABASE_NAME"):
    _db["NAME"] = os.environ["DELAYQ_TEST_DATABASE_NAME"]

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
if os.environ.get("DELAYQ_TEST_LEASE"):
    DELAYQ["LEASE"] = float(os.environ["DELAYQ_TEST_LEASE"])
if os.environ.get("DELAYQ_TEST_POLL"):
    DELAYQ["POLL_INTERVAL"] = float(os.environ["DELAYQ_TEST_POLL"])
if os.environ.get("DELAYQ_TEST_GRACE"):
    DELAYQ["SHUTDOWN_GRACE"] = float(os.environ["DELAYQ_TEST_GRACE"])
# Cron schedules for worker subprocesses, as JSON: {"name": {"every": 2, "queue": "ticks"}}.
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
