"""The structured fields of the worker's log records about one message.

Every record the worker logs about a message carries these as attributes
(``logging``'s ``extra=``): ``message_id``, ``queue``, ``key``, ``kind`` and
``attempt`` (counting from 1), and where it applies ``outcome`` (``succeeded``,
``retrying``, ``snoozed``, ``failed``, ``discarded``, ``lease_lost``) and
``duration`` (the handler's run time in seconds). A JSON formatter (such as
python-json-logger's) writes them as fields, so logs can be searched by
message, queue or key without parsing the text; a plain format can name them
(``%(queue)s``) in a handler attached to the ``django_delayq`` logger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_delayq.models import Message

FIELDS = ("message_id", "queue", "key", "kind", "attempt", "outcome", "duration")


def message_fields(message: Message, **more: Any) -> dict[str, Any]:
    """The ``extra=`` of a log record about ``message``."""
    return {
        "message_id": message.pk,
        "queue": message.queue,
        "key": message.key,
        "kind": message.kind,
        "attempt": message.attempt_count,
        **more,
    }
