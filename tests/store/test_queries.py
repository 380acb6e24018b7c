"""The contract of ``store/queries.py``: each verb returns what its docstring says.

The queue's verbs (``QueueQuerySet``) run on ``Message`` and on the
``QueueFields`` model; the per-queue figures (``MessageQuerySet``) on
``Message``. The rows sit at fixed times around a fixed "now", so that the
per-minute figures fall in known minutes.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_delayq.models import Message
from django_delayq.status import Status
from django_delayq.store import queries
from django_delayq.store.queries import distinct_values, estimated_count
from tests.conftest import FakeClock
from tests.factories import MessageFactory
from tests.store.tables import Table, can

pytestmark = pytest.mark.django_db

NOW = datetime(2030, 1, 1, 12, 0, 30, tzinfo=UTC)
FP1, FP2 = "f" * 32, "e" * 32


def t(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


@pytest.fixture
def now(fake_clock: FakeClock) -> datetime:
    fake_clock.current = NOW
    return NOW


def add_rows(table: Table) -> dict[str, Any]:
    """One row of every kind the verbs tell apart (queue "a" or "b" where there is one)."""
    queue_a = {"queue": "a"} if table.has("queue") else {}
    queue_b = {"queue": "b"} if table.has("queue") else {}

    def finished(status: str, seconds: float, **fields: Any) -> dict[str, Any]:
        out = {"status": status, "due": None, **fields}
        if table.has("finished_at"):
            out["finished_at"] = t(seconds)
        return out

    def failing(fingerprint: str) -> dict[str, Any]:
        return {"error_fingerprint": fingerprint} if table.has("error_fingerprint") else {}

    specs: dict[str, dict[str, Any]] = {
        "pending_due": {"due": t(-10), "locked_by": "w1", **queue_a},
        "pending_now": {"due": t(0), **queue_a},
        "pending_later": {"due": t(60), **queue_a},
        "pending_null": {"due": None, **queue_b},
        "retrying": {
            "due": t(30),
            "attempt_count": 1,
            "last_error": "x",
            "last_attempt_time": t(-5),
            **failing(FP1),
            **queue_a,
        },
        "released": {"due": t(5), "attempt_count": 1, **queue_a},  # no error recorded
        "retrying_due": {
            "due": t(-1),
            "attempt_count": 2,
            "last_attempt_time": t(-50),
            **failing(FP1),
            **queue_b,
        },
        "held": {
            "status": "running",
            "due": t(30),
            "attempt_count": 1,
            "locked_by": "w1",
            "lock_token": uuid.uuid4(),
            **queue_a,
        },
        "expired": {
            "status": "running",
            "due": t(-1),
            "attempt_count": 1,
            "locked_by": "w2",
            "lock_token": uuid.uuid4(),
            **queue_b,
        },
        "succeeded_old": finished("succeeded", -120, locked_by="w1", **queue_a),
        "succeeded_recent": finished("succeeded", -5, **queue_a),
        "failed": finished("failed", -30, last_attempt_time=t(-31), **failing(FP1), **queue_b),
        "failed_a": finished("failed", -61, last_attempt_time=t(-62), **failing(FP2), **queue_a),
        "cancelled": finished("cancelled", -10, **queue_a),
    }
    return {name: table.add(**spec) for name, spec in specs.items()}


def names(rows: dict[str, Any], found: Any) -> set[str]:
    pks = set(found.values_list("pk", flat=True))
    return {name for name, pk in rows.items() if pk in pks}


# -- the queue's verbs, on both kinds of table ----------------------------------------


def test_the_state_verbs_select_their_rows(table: Table, now: datetime) -> None:
    rows = add_rows(table)
    objects = table.model.objects

    assert names(rows, objects.active()) == {
        "pending_due",
        "pending_now",
        "pending_later",
        "pending_null",
        "retrying",
        "released",
        "retrying_due",
        "held",
        "expired",
    }
    assert names(rows, objects.due()) == {"pending_due", "pending_now", "retrying_due", "expired"}
    assert names(rows, objects.due(t(30))) == names(rows, objects.due()) | {
        "retrying",
        "released",
        "held",
    }
    assert names(rows, objects.held()) == {"held"}
    assert names(rows, objects.held(t(-2))) == {"held", "expired"}
    assert names(rows, objects.finished()) == {
        "succeeded_old",
        "succeeded_recent",
        "failed",
        "failed_a",
        "cancelled",
    }
    assert names(rows, objects.retrying()) == {"retrying", "released", "retrying_due"}
    # Running rows of these workers, whatever their lease; not a pending or finished
    # row that a worker once held.
    assert names(rows, objects.held_by(["w1"])) == {"held"}
    assert names(rows, objects.held_by(["w1", "w2", "w3"])) == {"held", "expired"}
    assert names(rows, objects.held_by([])) == set()


def test_next_due_is_the_earliest_due_time_of_the_active_rows(table: Table, now: datetime) -> None:
    assert queries.next_due(table.model, None, using="default") is None
    table.add(status="failed", due=t(-3600))  # finished: not waited for
    table.add(due=None)
    assert queries.next_due(table.model, None, using="default") is None
    table.add(due=t(60))
    table.add(status="running", due=t(20), lock_token=uuid.uuid4())
    assert queries.next_due(table.model, None, using="default") == t(20)


def test_next_due_of_some_queues_leaves_the_other_queues_out(now: datetime) -> None:
    Table(Message).add(queue="a", due=t(30))
    Table(Message).add(queue="b", due=t(10))
    assert queries.next_due(Message, ["a"], using="default") == t(30)
    assert queries.next_due(Message, ["b", "a"], using="default") == t(10)
    assert queries.next_due(Message, ["c"], using="default") is None
    # The statement is built once per queues: a second read is one query.
    with CaptureQueriesContext(connection) as read:
        assert queries.next_due(Message, ["a", "b"], using="default") == t(10)
    assert len(read.captured_queries) == 1


def test_categorised_counts_each_row_in_its_category(table: Table, now: datetime) -> None:
    add_rows(table)
    assert table.model.objects.categorised() == {
        "pending_due": 3,
        "pending_later": 4,
        "running": 1,
        "lease_expired": 1,
        "succeeded": 2,
        "failed": 2,
        "cancelled": 1,
    }


def test_the_categories_are_disjoint_and_cover_every_row(table: Table, now: datetime) -> None:
    for status in Status.values:
        for due in (None, t(-1), t(0), t(1)):
            table.add(status=status, due=due)
    conditions = queries.categories()
    objects = table.model.objects
    for pk in table.pks():
        matching = [name for name, q in conditions.items() if objects.filter(q, pk=pk).exists()]
        assert len(matching) == 1, (table.state(pk), matching)
    counts = objects.categorised()
    assert sum(counts.values()) == len(table.pks())
    assert all(counts[name] for name in counts)  # each category holds a row


def test_categories_are_judged_on_the_given_clock(table: Table, now: datetime) -> None:
    table.add(status="running", due=t(10), lock_token=uuid.uuid4())
    assert table.model.objects.categorised()["running"] == 1
    later = table.model.objects.categorised(t(10))
    assert (later["running"], later["lease_expired"]) == (0, 1)


# -- Message's verbs -----------------------------------------------------------------------


def message_rows() -> dict[str, Any]:
    return add_rows(Table(Message))


def test_expired_is_finished_before_the_cutoff(now: datetime) -> None:
    rows = message_rows()
    assert names(rows, Message.objects.expired(t(-30))) == {"succeeded_old", "failed_a"}


def test_in_queues_narrows_to_the_queues_given_and_none_means_every_queue(
    now: datetime,
) -> None:
    rows = message_rows()
    assert names(rows, Message.objects.in_queues(None)) == set(rows)
    assert names(rows, Message.objects.in_queues([])) == set(rows)
    b_rows = {"pending_null", "retrying_due", "expired", "failed"}
    assert names(rows, Message.objects.in_queues(["b"])) == b_rows
    assert names(rows, Message.objects.in_queues(["b", "c"])) == b_rows


def test_failing_is_failed_or_retrying_after_a_recorded_error(now: datetime) -> None:
    rows = message_rows()
    Message.objects.filter(pk=rows["cancelled"]).update(error_fingerprint=FP1)
    assert names(rows, Message.objects.failing()) == {
        "failed",
        "failed_a",
        "retrying",
        "retrying_due",
    }


def test_untouched_is_pending_and_never_attempted(now: datetime) -> None:
    rows = message_rows()
    assert names(rows, Message.objects.untouched()) == {
        "pending_due",
        "pending_now",
        "pending_later",
        "pending_null",
    }


def test_ticks_are_the_active_rows_of_the_queues_whose_key_starts_with_the_prefix(
    now: datetime,
) -> None:
    table = Table(Message)
    wanted = {
        table.add(queue="a", key="cron:job:1"),
        table.add(queue="b", key="cron:job:2", status="running", lock_token=uuid.uuid4()),
    }
    table.add(queue="a", key="cron:job:3", status="succeeded", due=None)
    table.add(queue="a", key="cron:other:1")
    table.add(queue="c", key="cron:job:4")
    table.add(queue="a", key="x-cron:job:5")
    found = Message.objects.ticks(["b", "a", "a"], "cron:job:")
    assert set(found.values_list("pk", flat=True)) == wanted


# -- ordered groups ---------------------------------------------------------------------


def group_rows() -> dict[str, Any]:
    """Groups of queue "a" in every state a group's first message can be in."""
    table = Table(Message)
    retry = {"attempt_count": 1, "error_fingerprint": FP1, "last_error": "x", "due": t(60)}
    return {
        "free": table.add(queue="a"),
        "free_held": table.add(queue="a", due=None),  # no group: not held by one
        # g1: the first waits for a retry after an error; the others are held.
        "g1_head": table.add(queue="a", group="g1", **retry),
        "g1_held": table.add(queue="a", group="g1", due=None),
        # g2: the first runs; the second is held.
        "g2_head": table.add(
            queue="a", group="g2", status="running", due=t(30), lock_token=uuid.uuid4()
        ),
        "g2_held": table.add(queue="a", group="g2", due=None),
        # g3: the first failed; the second waits for it (where failures block).
        "g3_head": table.add(queue="a", group="g3", status="failed", due=None, attempt_count=3),
        "g3_held": table.add(queue="a", group="g3", due=None),
        # g4: done with its first; the second was snoozed (attempted, no error).
        "g4_done": table.add(queue="a", group="g4", status="succeeded", due=None),
        "g4_snoozed": table.add(queue="a", group="g4", attempt_count=1, due=t(60)),
        # g5: an earlier message comes first, then one waiting for its retry.
        "g5_head": table.add(queue="a", group="g5"),
        "g5_retrying": table.add(queue="a", group="g5", **retry),
        # The same group name in another queue is another group.
        "b_g1_head": table.add(queue="b", group="g1", **retry),
    }


def test_waiting_for_group_is_pending_without_a_due_time_in_a_group(now: datetime) -> None:
    rows = group_rows()
    assert names(rows, Message.objects.waiting_for_group()) == {"g1_held", "g2_held", "g3_held"}


def test_blocked_group_heads_are_the_first_messages_that_are_failing(now: datetime) -> None:
    rows = group_rows()
    heads = Message.objects.blocked_group_heads()
    assert names(rows, heads) == {"g1_head", "g3_head", "b_g1_head"}
    assert names(rows, heads.in_queues(["a"])) == {"g1_head", "g3_head"}
    # Where failed messages let their group go on, a failed first message blocks
    # nothing, and does not come before the later ones either.
    assert names(rows, Message.objects.blocked_group_heads(["a"])) == {"g1_head", "b_g1_head"}
    Table(Message).set(rows["g5_head"], status="failed", next_attempt_time=None)
    assert "g5_retrying" in names(rows, Message.objects.blocked_group_heads(["a"]))
    assert "g5_retrying" not in names(rows, Message.objects.blocked_group_heads())


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'",
    reason="the planner's use of a partial index for a bound condition: PostgreSQL's",
)
def test_the_probe_for_an_earlier_message_of_the_group_uses_the_group_index(
    now: datetime,
) -> None:
    group_rows()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # the table is small
    plan = str(Message.objects.blocked_group_heads().explain())
    # Without the index's own condition in the probe, PostgreSQL read the
    # primary key's range below each failing message instead.
    assert "delayq_group_idx" in plan, plan


# -- per-queue figures ----------------------------------------------------------------------


def test_depth_by_queue_counts_the_active_rows_per_queue(now: datetime) -> None:
    message_rows()
    assert Message.objects.depth_by_queue(NOW) == {
        "a": {
            "pending": 5,
            "running": 1,
            "due": 2,
            "scheduled": 1,
            "retrying": 2,
            "leased": 1,
            "oldest_due": t(-10),
        },
        "b": {
            "pending": 2,
            "running": 1,
            "due": 2,
            "scheduled": 0,
            "retrying": 0,
            "leased": 0,
            "oldest_due": t(-1),
        },
    }


def test_failed_by_queue_counts_failed_rows_per_queue(now: datetime) -> None:
    message_rows()
    assert Message.objects.failed_by_queue() == {"a": 1, "b": 1}


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    failed=st.dictionaries(st.sampled_from(["a", "b", "b-1", "é", "z" * 40]), st.integers(0, 7)),
    others=st.lists(st.sampled_from(["a", "c", "é"]), max_size=4),
    cap=st.integers(0, 6),
)
def test_failed_by_queue_capped_counts_each_queue_up_to_one_past_the_cap(
    now: datetime, failed: dict[str, int], others: list[str], cap: int
) -> None:
    """The dashboard's count: every queue with a failed row, none other (a live or a
    succeeded row's queue is not one), each exact up to ``cap + 1``."""
    Message.objects.all().delete()
    rows = [
        MessageFactory.build(queue=queue, status=Status.FAILED, finished_at=t(-i))
        for queue, n in failed.items()
        for i in range(n)
    ]
    rows += [MessageFactory.build(queue=queue, status=Status.SUCCEEDED) for queue in others]
    rows += [MessageFactory.build(queue=queue) for queue in others]
    Message.objects.bulk_create(rows)
    assert Message.objects.failed_by_queue(cap) == {
        q: min(n, cap + 1) for q, n in failed.items() if n
    }
    assert Message.objects.failed_by_queue() == {q: n for q, n in failed.items() if n}


def test_finished_by_queue_counts_the_long_and_the_short_window(now: datetime) -> None:
    message_rows()
    zero = dict.fromkeys(
        ("succeeded_short", "failed_short", "succeeded_long", "failed_long", "cancelled_long"), 0
    )
    assert Message.objects.finished_by_queue(since=t(-100), recent=t(-20)) == {
        "a": zero
        | {"succeeded_short": 1, "succeeded_long": 1, "failed_long": 1}
        | {"cancelled_long": 1},
        "b": zero | {"failed_long": 1},
    }


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'",
    reason="the planner's use of a partial index's leading column: PostgreSQL's",
)
def test_finished_by_queue_reads_a_range_of_the_finished_index_per_status(
    now: datetime,
) -> None:
    message_rows()
    # Many messages finished long ago, as in a table kept for a week: the
    # planner weighs reading them all against a range per status.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_delayq_message (queue, key, kind, payload, status, priority,"
            " scheduled_time, attempt_count, last_error, last_traceback, lock_token, locked_by,"
            " error_fingerprint, message_group, created_at, updated_at, finished_at)"
            " SELECT 'old', 'old-' || g, '', '{}', 'succeeded', 0, %s, 1, '', '', NULL, '', '',"
            " '', %s, %s, %s FROM generate_series(1, 20000) AS g",
            [t(-86400)] * 4,
        )
        cursor.execute("ANALYZE django_delayq_message")
    with CaptureQueriesContext(connection) as captured:
        Message.objects.finished_by_queue(since=t(-100), recent=t(-20))
    statements = [q["sql"] for q in captured.captured_queries]
    assert len(statements) == 2  # succeeded and failed, then cancelled
    for sql in statements:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        # "status IN (finished)" is the index's own condition, which PostgreSQL
        # drops: the scan then read the whole index for the finished_at range.
        # The queue is in the index: no page of the table is read.
        ranges = [line for line in plan.splitlines() if "Index Cond" in line]
        assert "Index Only Scan using delayq_finished_idx" in plan and ranges, plan
        assert all("status" in line and "finished_at" in line for line in ranges), plan


def test_finished_per_minute_counts_successes_and_failures_per_utc_minute(
    now: datetime,
) -> None:
    message_rows()
    noon = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    assert Message.objects.finished_per_minute(since=t(-100)) == {
        (noon, "succeeded"): 1,  # 12:00:25
        (noon, "failed"): 1,  # 12:00:00
        (noon - timedelta(minutes=1), "failed"): 1,  # 11:59:29
    }
    assert queries.minute(datetime(2030, 1, 1, 13, 0, 59, 999999, tzinfo=UTC)) == datetime(
        2030, 1, 1, 13, 0, tzinfo=UTC
    )


def test_queue_stats_count_the_live_the_failed_kept_and_the_last_hours_finished(
    now: datetime,
) -> None:
    from django_delayq.stats import queue_stats

    message_rows()
    figures = ("due", "scheduled", "retrying", "running", "failed", "succeeded", "cancelled")

    def table() -> dict[str, tuple[Any, ...]]:
        return {s.queue: (*(getattr(s, f) for f in figures), s.oldest_due) for s in queue_stats()}

    assert table() == {"a": (2, 1, 2, 1, 1, 2, 1, t(-10)), "b": (2, 0, 0, 0, 1, 0, 0, t(-1))}
    # Past the hour, a success or a cancellation is history (read by no count);
    # a failure kept still counts, as a queue's failures wait for an operator.
    for queue, key, status in [
        ("a", "old-ok", "succeeded"),
        ("a", "old-no", "cancelled"),
        ("c", "old-ok", "succeeded"),
        ("a", "old-bad", "failed"),
    ]:
        Message.objects.create(
            queue=queue, key=key, status=status, scheduled_time=t(-3700), finished_at=t(-3601)
        )
    assert table() == {"a": (2, 1, 2, 1, 2, 2, 1, t(-10)), "b": (2, 0, 0, 0, 1, 0, 0, t(-1))}
    assert [s.queue for s in queue_stats(["b"])] == ["b"]


def test_failure_groups_group_failing_rows_by_fingerprint_and_queue(now: datetime) -> None:
    rows = message_rows()
    groups = {
        (g.pop("error_fingerprint"), g.pop("queue")): g for g in Message.objects.failure_groups()
    }
    assert groups == {
        (FP1, "a"): {
            "failed": 0,
            "retrying": 1,
            "first_seen": t(-5),
            "last_seen": t(-5),
            "sample_id": rows["retrying"],
        },
        (FP1, "b"): {
            "failed": 1,
            "retrying": 1,
            "first_seen": t(-50),
            "last_seen": t(-31),
            "sample_id": max(rows["failed"], rows["retrying_due"]),
        },
        (FP2, "a"): {
            "failed": 1,
            "retrying": 0,
            "first_seen": t(-62),
            "last_seen": t(-62),
            "sample_id": rows["failed_a"],
        },
    }


def test_created_bounds_are_read_off_the_first_and_the_last_row(now: datetime) -> None:
    assert Message.objects.created_bounds() is None
    table = Table(Message)
    first = table.add(created_at=t(-300))
    table.add(created_at=t(-900))  # between them by id: not read
    table.add(created_at=t(-60))
    assert Message.objects.created_bounds() == (t(-300), t(-60))
    Message.objects.filter(pk=first).update(created_at=t(0))
    # Bounds, whichever of the two is older.
    assert Message.objects.created_bounds() == (t(-60), t(0))


# -- cheap figures for big tables ----------------------------------------------------------


def test_distinct_values_lists_each_queue_or_kind_once_in_order(now: datetime) -> None:
    table = Table(Message)
    for queue, kind in (("b", ""), ("a", "y"), ("c", "x"), ("a", "x"), ("b", "y")):
        table.add(queue=queue, kind=kind)
    assert distinct_values("queue") == ["a", "b", "c"]
    assert distinct_values("queue", limit=2) == ["a", "b"]
    assert distinct_values("kind") == ["x", "y"]  # the empty kind is left out
    assert distinct_values("kind", using="default") == ["x", "y"]


def test_distinct_values_of_an_empty_table_is_empty() -> None:
    assert distinct_values("queue") == []
    assert distinct_values("kind") == []


def test_distinct_values_refuses_other_columns() -> None:
    with pytest.raises(ValueError, match="column must be one of"):
        distinct_values("status")
    with pytest.raises(ValueError):
        distinct_values("queue; DROP TABLE x")


# Transactional: MariaDB's ANALYZE TABLE commits the open transaction.
@pytest.mark.django_db(transaction=True)
def test_estimated_count_is_the_databases_own_estimate(now: datetime) -> None:
    table = Table(Message)
    for _ in range(7):
        table.add()
    with connection.cursor() as cursor:
        if can().row_estimate is None:
            assert estimated_count() is None  # SQLite keeps no estimate
            return
        name = connection.ops.quote_name(Message._meta.db_table)
        cursor.execute(
            f"ANALYZE {name}" if can().row_estimate == "pg_class" else f"ANALYZE TABLE {name}"
        )
        if connection.vendor == "mysql":
            cursor.fetchall()
    estimate = estimated_count()
    if can().row_estimate == "pg_class":
        assert estimate == 7  # a small table is read whole by ANALYZE
    else:
        assert estimate is None or (isinstance(estimate, int) and estimate >= 0)
