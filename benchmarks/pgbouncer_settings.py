"""Settings of benchmarks/pgbouncer.py: the benchmark settings, POLL_INTERVAL at
its default (5 s), and with ``BENCH_LISTEN_URL`` a direct alias to LISTEN on."""

import os

from benchmarks.settings import *  # noqa: F403

DELAYQ = {"PRUNE_INTERVAL": None}
DATABASES.pop("direct", None)  # noqa: F405
if os.environ.get("BENCH_LISTEN_URL"):
    DATABASES["direct"] = env.db_url_config(os.environ["BENCH_LISTEN_URL"])  # noqa: F405
    DELAYQ["LISTEN_DATABASE"] = "direct"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_delayq": {"handlers": ["console"], "level": "INFO"}},
}
