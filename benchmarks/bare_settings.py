"""A Django project of no apps, on the benchmark's database (``benchmarks/startup.py``).

What any Django-based worker pays before its queue's own code runs: Django's
set-up and a connection. The database comes from ``BENCH_DATABASE_URL`` as
in the peers' settings; ``BENCH_APPS`` (comma-separated) installs apps, for
procrastinate's Django integration (``procrastinate.contrib.django``).
"""

import os

from benchmarks.peer_settings import (  # noqa: F401
    DATABASES,
    DEFAULT_AUTO_FIELD,
    LOGGING,
    SECRET_KEY,
    TIME_ZONE,
    USE_TZ,
)

INSTALLED_APPS = [app for app in os.environ.get("BENCH_APPS", "").split(",") if app]
