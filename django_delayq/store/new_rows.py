"""New messages before they are written, and what each key's write did.

Every message of one call is a copy of one template (:func:`template`): what
the call shares, with its own key and payload (:func:`row`). The write path
(``store/write.py``; ``store/without_returning.py`` on MariaDB/MySQL) takes a
call's messages as one :data:`Batch` and reports per key an :class:`Outcome`
and the row as stored.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState

from django_delayq.models import Message
from django_delayq.status import Status


class Outcome(enum.StrEnum):
    """What an enqueue did with its key: wrote a new message, rewrote the one there,
    or left that one as it was."""

    CREATED = "created"
    UPDATED = "updated"
    IGNORED = "ignored"


Written = dict[str, tuple[Outcome, Message]]


# One write() call, what each chunk of its keys is written with: the connection,
# the template, the encoded payloads, the payloads, on_conflict and each key's
# group if the call gave one per message (a plain tuple: no dearer than
# passing them one by one).
_Groups = Mapping[str, str] | None
Batch = tuple[BaseDatabaseWrapper, Message, Mapping[str, str], Mapping[str, Any], str, _Groups]


def template(
    queue: str,
    *,
    kind: str,
    priority: int,
    due: datetime,
    max_attempts: int | None,
    now: datetime,
    group: str = "",
) -> Message:
    """What every message of one call shares: everything but its key and payload
    (and its group, when a call gives one per message).

    Built from a blank message made once: ``Model.__init__`` costs more than
    the rest of a single enqueue's Python work.
    """
    shared = row(blank(), "", None)
    shared.queue = queue
    shared.kind = kind
    shared.priority = priority
    shared.next_attempt_time = shared.scheduled_time = due
    shared.max_attempts = max_attempts
    shared.created_at = shared.updated_at = now
    shared.group = group
    return shared


@cache
def blank() -> Message:
    # The times are set by template(); the epoch only stands in.
    epoch = datetime.fromtimestamp(0, tz=UTC)
    return Message(
        queue="",
        key="",
        payload=None,
        status=Status.PENDING,
        scheduled_time=epoch,
        created_at=epoch,
        updated_at=epoch,
    )


def row(shared: Message, key: str, payload: Any, pk: int | None = None) -> Message:
    """A copy of ``shared`` for one message, without running ``Model.__init__``."""
    message = Message.__new__(Message)
    message.__dict__.update(shared.__dict__)
    message._state = state = ModelState()
    message.key = key
    message.payload = payload
    if pk is not None:
        message.id = pk
        state.adding = False
    return message


def existing_rows(connection: BaseDatabaseWrapper, queue: str, keys: Sequence[str]) -> Any:
    return Message.objects.using(connection.alias).filter(queue=queue, key__in=list(keys))


__all__ = ["Batch", "Outcome", "Written", "blank", "existing_rows", "row", "template"]
