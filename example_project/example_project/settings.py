"""Settings of the django-delayq example project.

Everything that differs between machines comes from the environment
(django-environ): ``DATABASE_URL``, ``DEBUG``, ``SECRET_KEY``. Without any of
them the project runs on a SQLite file next to ``manage.py``, e.g.::

    DATABASE_URL=postgres://user:pass@localhost/delayq_example ./manage.py migrate
"""

import importlib.util
from pathlib import Path

import environ

from django_delayq.retry import ExponentialBackoff

# example_project/ (the directory holding manage.py).
BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str("SECRET_KEY", default="dev-only-insecure-key-change-me-in-production")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_delayq",
    "orders",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# -- database -------------------------------------------------------------------

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # run_delayq runs handlers in several threads (--concurrency), each with
    # its own connection, next to a lease-keeper thread and any producer
    # process. WAL lets readers proceed while one of them writes; IMMEDIATE
    # transactions take the write lock at BEGIN, so two writers queue up
    # (for up to `timeout` seconds) instead of failing with "database is
    # locked" when a read-then-write transaction tries to upgrade its lock.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True  # django-delayq stores aware datetimes; run_at must be aware.

STATIC_URL = "static/"

# -- the queue --------------------------------------------------------------------

# Every duration accepts a timedelta or a number of seconds. The values below
# are tuned for the demo (scripts/demo.sh): short leases and polls, and a
# quick backoff so that the failing message gives up within a few seconds.
DELAYQ = {
    # A claimed message is invisible to other workers this long; the worker
    # extends it while the handler runs, so it only matters after a crash.
    "LEASE": 30,
    # Longest idle sleep; a worker wakes earlier when the next message is due.
    "POLL_INTERVAL": 2,
    # Where messages come densely (four or more expected within this delay)
    # a worker waits this long and claims them together: less CPU per
    # message, up to that much more pickup latency at such rates. Sparser
    # streams and an idle worker claim each notification at once. None:
    # always at once.
    "CLAIM_DELAY": 0.025,
    # Attempts before a message is marked failed (a @handler may override).
    "MAX_ATTEMPTS": 3,
    # ~1 s, ~2 s, ~4 s ... (with jitter), never more than 10 s.
    "RETRY_POLICY": ExponentialBackoff(base=1, cap=10),
    # Finished messages stay visible in the admin this long, then are pruned.
    "RETENTION": 3 * 24 * 3600,
    # Per queue. The mail provider takes 2 emails a second: at most 2 of the
    # "emails" queue start in any second, across every worker and host (a
    # sliding window); the others wait, due, with no attempt spent.
    "QUEUES": {
        "emails": {"RATE_LIMIT": "2/s"},
    },
    # Recurring messages. Every worker installs the next ticks ahead (keys
    # embed the name, a hash of this configuration and the tick time, so any
    # number of workers never duplicate one); orders/handlers.py consumes
    # them. A real shop would send a nightly digest, e.g.
    #   {"cron": "0 2 * * *", "timezone": "Europe/Paris", "queue": "ops", ...};
    # the demo wants to see it run within seconds.
    "SCHEDULES": {
        "heartbeat": {"every": 3, "queue": "ops", "payload": {"check": "orders-backlog"}},
    },
    # Probes for a supervisor (docs: Deploying, "Health checks"): with
    # DELAYQ_HEALTH_PORT=8081 in the environment, `run_delayq` serves
    # `curl localhost:8081/healthz` and `/readyz` (one port per worker, or
    # pass `--health-port`). A worker whose database stays unreachable for
    # 5 minutes exits with status 75, for its supervisor to restart it.
    "HEALTH_PORT": env.int("DELAYQ_HEALTH_PORT", default=None),
    "DATABASE_OUTAGE_LIMIT": 300,
}

# Django's Tasks framework runs on django-delayq: ``@task`` functions
# (orders/tasks.py) are enqueued as messages of these queues and run by
# ``manage.py run_delayq``. Django 6 ships the framework; on Django 5.2 it is
# the django-tasks backport (an app of its own).
TASKS = {
    "default": {
        "BACKEND": "django_delayq.backends.DelayQBackend",
        "QUEUES": ["default", "emails"],
    },
}
if importlib.util.find_spec("django.tasks") is None:
    INSTALLED_APPS.append("django_tasks")

# How long after an order its follow-up email goes out. A real shop would
# wait days; the demo waits seconds.
ORDERS_FOLLOW_UP_DELAY = env.float("ORDERS_FOLLOW_UP_DELAY", default=5)

# -- logging ------------------------------------------------------------------------

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "console": {
            "format": "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s",
            "datefmt": "%H:%M:%S",
        },
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "console"},
    },
    "loggers": {
        # The worker's start, retries, failures and shutdown.
        "django_delayq": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # What the example's handlers do.
        "orders": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # Django's Tasks framework: each task's start and end (Django 6, then the backport).
        "django.tasks": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "django_tasks": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
