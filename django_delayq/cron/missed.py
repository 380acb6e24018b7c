"""Missed ticks, seen by the worker that claimed one.

The installers cancel a tick still waiting past its grace (``install.py``),
but only a tick nobody claimed yet: a worker started after an outage claims
at once, beside its first maintenance round, and every overdue tick its
claim took first would run, one after another, however late (a nightly job
several times in a row). Whichever thread comes first, the worker asks
:func:`skip_missed` before it runs a tick's first attempt: a tick that
started past its grace, and that its schedule's ``catch_up`` would not run,
is cancelled as the installer would have cancelled it, and not run.

Judged on the database's clock: the attempt's start is the claim's
``last_attempt_time``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from django_delayq.cron.declared import get_schedules
from django_delayq.cron.spec import KEY_PREFIX
from django_delayq.cron.ticks import missed_reason, parse_key
from django_delayq.logs import message_fields
from django_delayq.models import Message
from django_delayq.store import ticks

logger = logging.getLogger("django_delayq.worker")


def skip_missed(
    message: Any,
    token: uuid.UUID,
    *,
    using: str,
    later: list[Callable[[], None]] | None = None,
) -> bool:
    """Cancel ``message`` instead of running it if it is a tick claimed too late;
    True if it must not run.

    Only a tick's first attempt is judged: a later attempt is the retry of an
    occurrence that began in time. ``later`` is the worker's list of what to
    log once its group transaction commits (the cancellation is in it).
    """
    key = getattr(message, "key", "")
    if not (isinstance(message, Message) and key.startswith(KEY_PREFIX)):
        return False
    if message.attempt_count != 1 or message.last_attempt_time is None:
        return False
    parsed = parse_key(key)
    if parsed is None:
        return False
    name, _, tick = parsed
    sched = get_schedules(log=False).get(name)
    if sched is None or sched.queue != message.queue:
        return False  # not a schedule in force here: run it, as before it was judged
    started = message.last_attempt_time
    grace = sched.grace_for(tick)
    if started <= tick + grace:
        return False
    if sched.catch_up == "latest" and sched.previous_tick(started) == tick:
        # The latest occurrence by now: the one catch_up="latest" runs (an
        # installer would install the latest one if it were missing, and
        # cancel every earlier one: exactly one runs, whichever comes first).
        return False
    if not ticks.miss_tick(message.pk, token, reason=missed_reason(sched), using=using):
        return True  # claimed again by someone else meanwhile: theirs to judge

    def announce() -> None:
        logger.warning(
            "schedule %s: tick of %s missed: claimed %s after its time, past its grace "
            "of %s; cancelled, not run (catch_up=%s)",
            sched.name,
            tick.isoformat(),
            started - tick,
            grace,
            sched.catch_up,
            extra=message_fields(message, outcome="missed"),
        )

    if later is None:
        announce()
    else:
        later.append(announce)
    return True
