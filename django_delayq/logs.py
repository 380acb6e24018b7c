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

from django_delayq import durations

if TYPE_CHECKING:
    from django_delayq.models import Message

FIELDS = ("message_id", "queue", "key", "kind", "attempt", "outcome", "duration")


def who(message: Message) -> str:
    """How a log line names a message: ``message 5 (emails/welcome-5)``.

    A row of a project's own queue model (``QueueFields``) is named by its
    model (``orders.shipment 5 (shipments/ship-5)``): its id is not a
    ``Message`` id, and two lines a moment apart must not both say
    "message 5" about different rows.
    """
    from django_delayq.models import Message

    model = type(message)
    name = "message" if model is Message else model._meta.label_lower
    return f"{name} {message.pk} ({message.queue}/{message.key})"


def duration(seconds: float) -> str:
    """A delay or a limit as a log line gives it (``598ms``, ``2.0s``, ``1.5h``),
    not a ``timedelta``'s ``0:00:00.598240``."""
    return durations.human(seconds, durations.REPORT)


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
