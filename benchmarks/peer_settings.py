"""Settings of the Django-based peers (django-tasks-db, the ORM loop).

Used in the peers' own virtualenv, which has only Django, psycopg and the
peers: the database comes from ``BENCH_DATABASE_URL`` without django-environ.
"""

import os
from urllib.parse import urlsplit

_url = urlsplit(os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/x"))

SECRET_KEY = "benchmarks-only"
DEBUG = os.environ.get("BENCH_DEBUG") == "1"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_tasks", "django_tasks_db", "benchmarks.peerapp"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "postgres",
        "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": _url.port or 5432,
        # Persistent connections: db_worker calls close_old_connections() around
        # every task, which with the default of 0 reconnects per task.
        "CONN_MAX_AGE": None,
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["noop", "write"]}}
LOGGING = {"version": 1}
