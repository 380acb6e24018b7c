"""The wake-up of idle workers when new messages are written: a NOTIFY on PostgreSQL,
datagrams to the local workers on SQLite (``store/localwake.py``).

The worker's side, what wakes it, is ``worker/wakeup.py``.
"""

from __future__ import annotations

import json
from datetime import datetime

from django.db.backends.base.base import BaseDatabaseWrapper

from django_delayq import clock
from django_delayq.conf import get_config, to_timedelta
from django_delayq.store import localwake
from django_delayq.store.features import features
from django_delayq.store.sql import statement

NOTIFY_CHANNEL = "django_delayq"


def notify_body(connection: BaseDatabaseWrapper, queue: str, due: datetime) -> str | None:
    """The NOTIFY payload for a wake-up, or None where there is no NOTIFY.

    It carries the due time so that a worker sleeping until a later message
    shortens its sleep for a sooner one. A message due after the next poll
    needs none: an idle worker sleeps at most ``POLL_INTERVAL`` and then
    looks up the next due time, so it learns of the message before it is
    due (and the NOTIFY would cost every commit a global lock for nothing).
    """
    config = get_config()
    can = features(connection)
    if not (can.notify or can.local_wake) or not config["NOTIFY"]:
        return None
    if due - clock.now() > to_timedelta(config["POLL_INTERVAL"]):
        return None
    return json.dumps({"queue": queue, "due": due.timestamp()})


def notify(connection: BaseDatabaseWrapper, queue: str, due: datetime) -> None:
    """Wake idle workers of ``queue``; sent on commit, dropped on rollback (a NOTIFY on
    PostgreSQL, datagrams to the local workers on SQLite)."""
    body = notify_body(connection, queue, due)
    if body is None:
        return
    if features(connection).local_wake:
        localwake.on_commit(connection, body)
        return
    with connection.cursor() as cursor:
        cursor.execute(statement("notify", features(connection)), [NOTIFY_CHANNEL, body])


__all__ = ["NOTIFY_CHANNEL", "notify", "notify_body"]
