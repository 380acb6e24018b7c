"""Failure triage: failed and retrying messages grouped by error fingerprint.

``store.settle.fail`` stores a fingerprint of every recorded error
(``fingerprint.py``), so a group is one indexed value: grouping is one
``GROUP BY`` answered from ``delayq_fingerprint_idx`` alone, and acting on a
group is a set-based operation (``operations.py``) on the rows with that
value, however many there are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction

from django_delayq import operations
from django_delayq.exceptions import DelayQError
from django_delayq.fingerprint import normalise, normalise_message, split_error
from django_delayq.models import Message
from django_delayq.payload import check_payload, check_text_depth
from django_delayq.routers import queue_alias
from django_delayq.store import operators
from django_delayq.store.queries import MessageQuerySet

S = Message.Status


def failing(using: str | None = None) -> MessageQuerySet:
    """Messages to triage: failed, or pending again after a recorded error."""
    return Message.objects.using(queue_alias(using, read=True)).failing()


def group_messages(
    fingerprint: str, queues: list[str] | None = None, *, using: str | None = None
) -> MessageQuerySet:
    """The failed and retrying messages of one group."""
    return failing(using).filter(error_fingerprint=fingerprint).in_queues(queues)


@dataclass(frozen=True)
class FailureGroup:
    """Failed and retrying messages whose last errors share a fingerprint."""

    fingerprint: str
    sample_id: int
    sample_error: str
    failed: int
    retrying: int
    first_seen: datetime | None
    last_seen: datetime | None
    queues: tuple[str, ...]

    @property
    def count(self) -> int:
        return self.failed + self.retrying

    @property
    def error_type(self) -> str:
        return split_error(self.sample_error)[0]

    @property
    def normalised(self) -> str:
        return normalise(self.sample_error)

    @property
    def normalised_message(self) -> str:
        """The normalised message without the exception type."""
        return normalise_message(split_error(self.sample_error)[1])


@dataclass
class _Sums:
    failed: int = 0
    retrying: int = 0
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    sample_id: int = 0
    queues: set[str] = field(default_factory=set)

    def add(self, row: Mapping[str, Any]) -> None:
        self.failed += row["failed"]
        self.retrying += row["retrying"]
        self.queues.add(row["queue"])
        self.sample_id = max(self.sample_id, row["sample_id"])
        if row["first_seen"] is not None:
            self.first_seen = min(filter(None, (self.first_seen, row["first_seen"])))
            self.last_seen = max(filter(None, (self.last_seen, row["last_seen"])))


def failure_groups(
    queues: list[str] | None = None,
    *,
    limit: int = 100,
    since: datetime | None = None,
    using: str | None = None,
) -> list[FailureGroup]:
    """The largest failure groups, most messages first; with ``since``, of the
    failing messages whose last attempt was then or later only.

    One ``GROUP BY (fingerprint, queue)`` that reads only a covering
    partial index (so the queues hit come with the counts), then one
    primary-key lookup for a sample error per group (the newest member's:
    members normalise alike). "Seen" is the time of the failing attempt.
    All of them is every failure retention keeps, a read of hundreds of
    thousands of index entries in a week of a busy queue's history; a
    window (the admin's failures page shows the last day) reads its own.
    """
    alias = queue_alias(using, read=True)
    rows = Message.objects.using(alias).in_queues(queues).failure_groups(since)
    sums: dict[str, _Sums] = {}
    for row in rows:
        sums.setdefault(row["error_fingerprint"], _Sums()).add(row)
    top = sorted(
        sums.items(),
        key=lambda item: (
            -(item[1].failed + item[1].retrying),
            -(item[1].last_seen.timestamp() if item[1].last_seen else 0),
        ),
    )[:limit]
    samples = dict(
        Message.objects.using(alias)
        .filter(pk__in=[s.sample_id for _, s in top])
        .values_list("id", "last_error")
    )
    return [
        FailureGroup(
            fingerprint=fp,
            sample_id=s.sample_id,
            sample_error=samples.get(s.sample_id, ""),
            failed=s.failed,
            retrying=s.retrying,
            first_seen=s.first_seen,
            last_seen=s.last_seen,
            queues=tuple(sorted(s.queues)),
        )
        for fp, s in top
    ]


def _merge(*results: operations.OperationResult) -> operations.OperationResult:
    skipped: dict[str, int] = {}
    for result in results:
        for reason, n in result.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
    return operations.OperationResult(sum(r.changed for r in results), skipped)


def retry_group(
    fingerprint: str,
    queues: list[str] | None = None,
    *,
    extra_attempts: int = 1,
    dry_run: bool = False,
    using: str | None = None,
) -> operations.OperationResult:
    """Run a group again now: failed messages go back to pending (``retry_failed``),
    retrying ones waiting for their backoff become due now (``run_now``)."""
    group = group_messages(fingerprint, queues, using=queue_alias(using))
    # run_now first: after retry_failed the retried messages are pending too.
    waiting = operations.run_now(group.filter(status=S.PENDING), dry_run=dry_run)
    retried = operations.retry_failed(
        group.filter(status=S.FAILED), extra_attempts=extra_attempts, dry_run=dry_run
    )
    return _merge(retried, waiting)


def cancel_group(
    fingerprint: str,
    queues: list[str] | None = None,
    *,
    dry_run: bool = False,
    using: str | None = None,
) -> operations.OperationResult:
    """Cancel a group's retrying messages; failed ones are finished already (skipped)."""
    group = group_messages(fingerprint, queues, using=queue_alias(using))
    return operations.cancel(group, dry_run=dry_run)


class PayloadError(DelayQError, ValueError):
    """The edited payload is not valid JSON or not a payload the queue accepts."""


def parse_payload(text: str) -> Any:
    """Decode and check an operator's JSON, with the same rules as ``enqueue``."""
    try:
        check_text_depth(text)  # before the parser recurses into it
    except ValueError as exc:
        raise PayloadError(str(exc)) from None
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PayloadError(f"not valid JSON: {exc}") from exc
    except RecursionError:  # the decoder's own limit (100,000 brackets)
        raise PayloadError("not valid JSON: nested too deeply") from None
    try:
        check_payload(payload)
    except (TypeError, ValueError) as exc:
        raise PayloadError(str(exc)) from exc
    return payload


def edit_payload_and_retry(
    message_id: int, payload: Any, *, extra_attempts: int = 1, using: str | None = None
) -> bool:
    """Replace a failed message's payload and send it back to pending, due now.

    False (and nothing written) if the message is not ``failed`` any more:
    the payload update is guarded by ``status = 'failed'`` and runs in one
    transaction with the retry, so an operator never overwrites a message
    that a worker, another operator or a re-enqueue changed meanwhile.
    """
    check_payload(payload)
    alias = queue_alias(using)
    with transaction.atomic(using=alias):
        if not operators.replace_failed_payload(message_id, payload, using=alias):
            return False
        target = Message.objects.using(alias).filter(pk=message_id)
        result = operations.retry_failed(target, extra_attempts=extra_attempts)
        return result.changed == 1
