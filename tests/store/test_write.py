"""The contract of the one write path of new messages: ``store/write.py`` and what it
writes with (``new_rows``, ``inserts``, ``without_returning``, ``loader``, ``wakeup``).

What each key's write did (``Outcome``) for every ``on_conflict``, in and
out of a transaction, across chunks; the Python twins of the upsert
(``same_content``, ``apply_update``, which MariaDB/MySQL write with) agree
with the SQL of PostgreSQL and SQLite; the template and its copies carry
every column; the Spark loader's statement writes what ``enqueue_many``
writes; and the wake-up is sent only where it can be.
"""

from __future__ import annotations

import copy
import json
import uuid
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_delayq import enqueue, enqueue_many
from django_delayq.exceptions import DuplicateMessage
from django_delayq.models import Message
from django_delayq.payload import encode_payload
from django_delayq.store import claim, loader, new_rows, wakeup, without_returning, write
from django_delayq.store.new_rows import Outcome
from tests.conftest import FakeClock
from tests.store.tables import at, can

pytestmark = pytest.mark.django_db

CREATED, UPDATED, IGNORED = Outcome.CREATED, Outcome.UPDATED, Outcome.IGNORED


def stored(key: str, queue: str = "q") -> Message:
    return Message.objects.get(queue=queue, key=key)


def inserts(queries: CaptureQueriesContext) -> int:
    return sum("INSERT" in q["sql"].upper() for q in queries)


def test_outcome_values_are_the_offer_outcomes() -> None:
    assert [o.value for o in Outcome] == ["created", "updated", "ignored"]
    assert Outcome("updated") is UPDATED


# -- what each key's write did -----------------------------------------------------------


@pytest.fixture
def existing(fake_clock: FakeClock) -> dict[str, dict[str, Any]]:
    """A message in every state a new version can meet, all due now at {"v": 1}."""
    enqueue("q", {"v": 1}, key="running")
    assert len(claim.claim(["q"], 10, worker="w", lease=timedelta(seconds=30)).messages) == 1
    for key in ("same", "changed", "finished"):
        enqueue("q", {"v": 1}, key=key)
    Message.objects.filter(key="finished").update(
        status="succeeded", next_attempt_time=None, finished_at=at(0), attempt_count=2
    )
    return {m.key: m.as_dict() for m in Message.objects.all()}


# The keys and new payloads of the call: "same" gets its own content again.
KEYS = ["same", "changed", "finished", "running", "new"]
PAYLOADS = [{"v": 1}, {"v": 2}, {"v": 2}, {"v": 2}, {"v": 2}]

EXPECTED = {
    "ignore": [IGNORED, IGNORED, IGNORED, IGNORED, CREATED],
    "update": [IGNORED, UPDATED, UPDATED, UPDATED, CREATED],
}


# Outside the test's transaction: autocommit takes paths of its own (on PostgreSQL an
# enqueue that only inserts is one statement, its NOTIFY included).
IN_TRANSACTION = pytest.mark.parametrize(
    "in_transaction",
    [
        pytest.param(False, id="autocommit", marks=pytest.mark.django_db(transaction=True)),
        pytest.param(True, id="atomic"),
    ],
)


@IN_TRANSACTION
@pytest.mark.parametrize("on_conflict", ["ignore", "update"])
def test_each_key_reports_what_its_write_did(
    on_conflict: str,
    in_transaction: bool,
    existing: dict[str, dict[str, Any]],
    fake_clock: FakeClock,
) -> None:
    with transaction.atomic() if in_transaction else nullcontext():
        results = enqueue_many("q", PAYLOADS, keys=KEYS, on_conflict=on_conflict)

    assert [r.outcome for r in results] == EXPECTED[on_conflict]
    for key, result in zip(KEYS, results, strict=True):
        # Whatever happened, the message returned is the message stored.
        assert result.message.as_dict() == stored(key).as_dict()
        if result.outcome is IGNORED and key in existing:
            assert stored(key).as_dict() == existing[key]
    if on_conflict == "update":
        assert stored("changed").payload == {"v": 2}
        finished = stored("finished")
        assert (finished.status, finished.attempt_count, finished.finished_at) == (
            "pending",
            0,
            None,
        )
        running = stored("running")
        assert (running.status, running.lock_token) == (
            "running",
            existing["running"]["lock_token"],
        )
        assert running.superseded_at == fake_clock()
    new = stored("new")
    assert (new.status, new.attempt_count, new.payload) == ("pending", 0, {"v": 2})


@IN_TRANSACTION
def test_error_reports_every_existing_key_and_writes_nothing(
    in_transaction: bool, existing: dict[str, dict[str, Any]]
) -> None:
    with transaction.atomic() if in_transaction else nullcontext():
        if in_transaction:
            kept = enqueue("q", {"v": 0}, key="callers-own")
        with pytest.raises(DuplicateMessage) as raised:
            enqueue_many("q", PAYLOADS, keys=KEYS, on_conflict="error")
        if in_transaction:
            # The caller's transaction goes on, with its own work.
            assert stored("callers-own").pk == kept.message.pk

    assert sorted(raised.value.keys) == ["changed", "finished", "running", "same"]
    assert not Message.objects.filter(key="new").exists()
    assert {m.key: m.as_dict() for m in Message.objects.exclude(key="callers-own")} == existing
    assert Message.objects.filter(key="callers-own").exists() == in_transaction


@pytest.mark.parametrize(
    ("on_conflict", "outcomes", "payload"),
    [
        ("ignore", [CREATED, CREATED, IGNORED], 1),
        ("update", [CREATED, CREATED, UPDATED], 3),
    ],
)
def test_a_key_repeated_in_one_call_is_written_once(
    on_conflict: str, outcomes: list[Outcome], payload: int
) -> None:
    """The first occurrence with ignore, the last with update."""
    results = enqueue_many("q", [1, 2, 3], keys=["a", "b", "a"], on_conflict=on_conflict)
    assert [r.outcome for r in results] == outcomes
    assert results[0].message.pk == results[2].message.pk == stored("a").pk
    assert stored("a").payload == payload
    assert Message.objects.count() == 2


def test_a_key_repeated_in_one_call_with_error_writes_nothing() -> None:
    with pytest.raises(DuplicateMessage) as raised:
        enqueue_many("q", [1, 2, 3], keys=["a", "b", "a"], on_conflict="error")
    assert raised.value.keys == ["a"]
    assert not Message.objects.exists()


@pytest.mark.parametrize("on_conflict", ["ignore", "update"])
def test_a_call_larger_than_a_chunk_writes_every_chunk(
    on_conflict: str, monkeypatch: pytest.MonkeyPatch, fake_clock: FakeClock
) -> None:
    enqueue_many("q", [0, 0], keys=["k02", "k05"])
    enqueue("q", 0, key="k07")
    Message.objects.filter(key="k07").update(status="failed", next_attempt_time=None)
    monkeypatch.setattr(write, "CHUNK_ROWS", 3)
    keys = [f"k{i:02}" for i in range(10)]

    with CaptureQueriesContext(connection) as queries:
        results = enqueue_many("q", [1] * 10, keys=keys, on_conflict=on_conflict)

    # Keys in sorted order, three a statement: k00-k02, k03-k05, k06-k08, k09.
    assert inserts(queries) == 4
    outcomes = {k: r.outcome for k, r in zip(keys, results, strict=True)}
    existing = {"k02", "k05", "k07"}
    assert {k for k, o in outcomes.items() if o is CREATED} == set(keys) - existing
    again = IGNORED if on_conflict == "ignore" else UPDATED
    assert {k for k, o in outcomes.items() if o is again} == existing
    assert Message.objects.count() == 10
    for key, result in zip(keys, results, strict=True):
        assert result.message.as_dict() == stored(key).as_dict()


def test_keys_are_written_in_sorted_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Producers whose batches overlap take the key locks in the same order."""
    monkeypatch.setattr(write, "CHUNK_ROWS", 1)
    enqueue_many("q", [1, 2, 3], keys=["c", "a", "b"])
    ids = [stored(k).pk for k in ("a", "b", "c")]
    assert ids == sorted(ids)


def test_a_chunk_is_also_cut_by_payload_size_where_the_packet_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MariaDB/MySQL: no statement over ``CHUNK_BYTES`` of payload text."""
    monkeypatch.setattr(write, "CHUNK_BYTES", 10)
    with CaptureQueriesContext(connection) as queries:
        results = enqueue_many("q", ["x" * 8] * 3, keys=["a", "b", "c"])
    assert [r.outcome for r in results] == [CREATED] * 3
    assert inserts(queries) == (1 if can().returning else 3)


def test_write_returns_each_keys_outcome_and_row(fake_clock: FakeClock) -> None:
    enqueue("q", "old", key="b")
    shared = new_rows.template("q", kind="k", priority=1, due=at(0), max_attempts=2, now=at(0))
    payloads = {"a": [1, "x"], "b": None}
    encoded = {k: encode_payload(v) for k, v in payloads.items()}

    written = write.write(connection, shared, ["b", "a"], encoded, payloads, "update")

    assert {k: o for k, (o, _) in written.items()} == {"a": CREATED, "b": UPDATED}
    for key, (_, message) in written.items():
        assert message.as_dict() == stored(key).as_dict()
        assert (message.kind, message.priority, message.max_attempts) == ("k", 1, 2)
    assert stored("b").payload is None


# -- same_content and apply_update: the twins of the upsert ---------------------------

STATES = ["pending", "retrying", "running", "succeeded", "failed", "cancelled"]
NEW_VERSIONS = {
    "identical": {},
    "payload": {"payload": {"v": 2}},
    "payload_true_for_1": {"payload": {"v": True}},
    "payload_keys_in_another_order": {"payload": {"w": 0, "v": 1}},
    "payload_float_for_int": {"payload": {"v": 1.0, "w": 0}},
    "payload_unicode": {"payload": {"v": "é\u2028", "w": 0}},
    "payload_null": {"payload": None},
    "kind": {"kind": "other"},
    "priority": {"priority": 5},
    "max_attempts": {"max_attempts": 9},
    "max_attempts_default": {"max_attempts": None},
    "due": {"due": timedelta(seconds=60)},
}


# JSON objects have no order; 1.0 is not 1, true is not 1 (see _same_json).
UNCHANGED = ("identical", "payload_keys_in_another_order")


def put_in_state(key: str, state: str) -> Message:
    """A message at {"v": 1, "w": 0}, kind "k", max_attempts 3, in ``state``."""
    enqueue("q", {"v": 1, "w": 0}, key=key, kind="k", max_attempts=3)
    rows = Message.objects.filter(key=key)
    if state == "retrying":
        rows.update(attempt_count=2, last_error="e", last_traceback="t", next_attempt_time=at(30))
    elif state == "running":
        assert claim.claim(["q"], 1, worker="w", lease=timedelta(seconds=30)).messages
    elif state != "pending":
        rows.update(
            status=state,
            next_attempt_time=None,
            finished_at=at(0),
            attempt_count=3,
            last_error="e",
            last_traceback="t",
        )
    return rows.get()


@pytest.mark.parametrize("change", NEW_VERSIONS)
@pytest.mark.parametrize("state", STATES)
def test_same_content_and_apply_update_do_what_the_upsert_does(
    state: str, change: str, fake_clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """MariaDB/MySQL write an update with these two; PostgreSQL and SQLite with SQL."""
    if change == "payload_keys_in_another_order" and connection.vendor == "sqlite":
        request.applymarker(
            pytest.mark.xfail(
                state in ("pending", "retrying"),
                strict=True,
                reason="known: SQLite's upsert compares payload text, where key order counts "
                "(same_content, PostgreSQL's jsonb and MariaDB ignore it)",
            )
        )
    current = put_in_state("k", state)
    fake_clock.advance(1)
    new = {
        "payload": {"v": 1, "w": 0},
        "kind": "k",
        "priority": 0,
        "max_attempts": 3,
        "due": current.next_attempt_time or at(0),
    } | NEW_VERSIONS[change]
    if isinstance(new["due"], timedelta):
        new["due"] = at(new["due"].total_seconds())
    shared = new_rows.template(
        "q",
        kind=new["kind"],
        priority=new["priority"],
        due=new["due"],
        max_attempts=new["max_attempts"],
        now=at(0),
    )
    incoming = new_rows.row(shared, "k", new["payload"])
    same = without_returning.same_content(current, incoming)
    # Only a waiting message whose content and schedule are unchanged is left alone.
    assert same is (state in ("pending", "retrying") and change in UNCHANGED)
    expected = copy.deepcopy(current)
    if not same:
        without_returning.apply_update(expected, incoming)

    written = write.write(
        connection,
        shared,
        ["k"],
        {"k": encode_payload(new["payload"])},
        {"k": new["payload"]},
        "update",
    )

    assert written["k"][0] is (IGNORED if same else UPDATED)
    assert stored("k").as_dict() == expected.as_dict()
    # As JSON too (Python calls 1 and 1.0 equal).
    assert exact(stored("k").payload) == exact(expected.payload)
    if not same:
        # What the update does, stated apart from apply_update (which MariaDB writes).
        assert_updated(current, stored("k"), new)


def assert_updated(old: Message, row: Message, new: dict[str, Any]) -> None:
    content = (row.kind, row.priority, row.max_attempts, row.scheduled_time, row.updated_at)
    assert content == (new["kind"], new["priority"], new["max_attempts"], new["due"], at(0))
    assert exact(row.payload) == exact(new["payload"])
    assert row.finished_at is None
    if old.status == "running":
        # The running attempt goes on; the new version waits for its end, and
        # the row is not claimable before either the lease or the new due time.
        kept = (row.status, row.lock_token, row.attempt_count)
        assert kept == ("running", old.lock_token, old.attempt_count)
        assert row.next_attempt_time == max(old.next_attempt_time, new["due"])
        assert row.superseded_at == at(0)
        return
    assert (row.status, row.next_attempt_time, row.lock_token) == ("pending", new["due"], None)
    assert row.superseded_at is None
    if old.status in ("succeeded", "failed", "cancelled"):
        # Delivered again, from its first attempt.
        assert (row.attempt_count, row.last_error, row.last_traceback) == (0, "", "")
    else:
        kept = (row.attempt_count, row.last_error, row.last_traceback)
        assert kept == (old.attempt_count, old.last_error, old.last_traceback)


def exact(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True)


def test_same_content_tells_json_values_python_calls_equal() -> None:
    shared = new_rows.template("q", kind="", priority=0, due=at(0), max_attempts=None, now=at(0))
    current = new_rows.row(shared, "k", {"v": 1})
    assert not without_returning.same_content(current, new_rows.row(shared, "k", {"v": True}))
    assert not without_returning.same_content(current, new_rows.row(shared, "k", {"v": 1.0}))
    assert without_returning.same_content(current, new_rows.row(shared, "k", {"v": 1}))
    current.status = "running"
    assert not without_returning.same_content(current, new_rows.row(shared, "k", {"v": 1}))


# -- template and row -------------------------------------------------------------------


def test_template_sets_every_column_of_a_new_message() -> None:
    due = datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    shared = new_rows.template("q", kind="k", priority=-3, due=due, max_attempts=7, now=now)
    expected = {
        "id": None,
        "queue": "q",
        "key": "",
        "kind": "k",
        "payload": None,
        "priority": -3,
        "status": "pending",
        "next_attempt_time": due,
        "scheduled_time": due,
        "attempt_count": 0,
        "max_attempts": 7,
        "last_attempt_time": None,
        "last_error": "",
        "last_traceback": "",
        "lock_token": None,
        "locked_by": "",
        "error_fingerprint": "",
        "created_at": now,
        "updated_at": now,
        "finished_at": None,
        "superseded_at": None,
        "group": "",
        "result": None,
        "on_parent_failure": "",
        "has_children": False,
        "parents_waiting": 0,
        "parents_failed": 0,
        "waited": False,
    }
    # Every column is named here: a new one needs its value decided.
    assert set(expected) == {f.attname for f in Message._meta.concrete_fields}
    assert shared.as_dict() == expected
    assert shared._state.adding
    # A template is its own object: the next call starts from a clean one.
    shared.queue = "changed"
    again = new_rows.template("r", kind="", priority=0, due=due, max_attempts=None, now=now)
    assert (again.queue, again.kind, again.max_attempts) == ("r", "", None)


def test_row_copies_every_column_of_the_template() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    shared = new_rows.template("q", kind="k", priority=2, due=now, max_attempts=4, now=now)
    shared.lock_token = uuid.uuid4()  # any column set on the template is copied

    fresh = new_rows.row(shared, "key-1", {"p": 1})
    known = new_rows.row(shared, "key-2", [2], pk=42)

    for message, key, payload, pk in ((fresh, "key-1", {"p": 1}, None), (known, "key-2", [2], 42)):
        assert message.as_dict() == shared.as_dict() | {"key": key, "payload": payload, "id": pk}
        assert message._state is not shared._state
    assert fresh._state.adding and not known._state.adding
    fresh.priority = 9
    assert shared.priority == 2 and known.priority == 2


# -- the Spark loader's statements (PostgreSQL, MariaDB/MySQL, SQLite) -------------------


def load(
    queue: str,
    rows: list[tuple[str, Any]],
    on_conflict: str,
    groups: list[str] | None = None,
) -> tuple[int, int]:
    """``bulk_load`` of ``(key, payload)`` rows (and their ``groups``), due now, as the
    loader runs it: (created, updated)."""
    now = at(0)
    shared = new_rows.template(queue, kind="", priority=0, due=now, max_attempts=None, now=now)
    loaded = loader.bulk_load(connection, shared, on_conflict, grouped=groups is not None)
    due = str(connection.ops.adapt_datetimefield_value(now))
    with connection.cursor() as cursor:
        if can().inserted_flag:
            cursor.execute(
                "CREATE TEMP TABLE delayq_load "
                "(ord bigint, key text, payload text, due text, grp text)"
            )
        elif not can().returning:
            cursor.execute(loaded.table_sql)
        else:
            cursor.execute("CREATE TEMP TABLE delayq_load (ord, key, payload, due, grp)")
        for i, (key, payload) in enumerate(rows):
            cursor.execute(
                "INSERT INTO delayq_load VALUES (%s, %s, %s, %s, %s)",
                [i, key, encode_payload(payload), due, "" if groups is None else groups[i]],
            )
        if can().inserted_flag:
            cursor.execute(loaded.sql, loaded.params)
            created, updated, _ = cursor.fetchone()
        elif not can().returning:
            # MariaDB/MySQL: the INSERT IGNORE counts what it created; the upsert
            # 2 per row it updated (Django's connection counts found rows: the
            # loader's does not, so here the rows it left alone are subtracted).
            cursor.execute(loaded.sql, loaded.params)
            created = cursor.rowcount
            assert bool(loaded.update_sql) == (on_conflict == "update")
            updated = 0
            if loaded.update_sql:
                cursor.execute(loaded.update_sql, loaded.params)
                updated = cursor.rowcount - len({k for k, _ in rows})
        else:
            cursor.execute(loaded.existing_sql, [queue])
            existing = cursor.fetchone()[0]
            before = connection.connection.total_changes
            cursor.execute(loaded.sql, loaded.params)
            written = connection.connection.total_changes - before
            created = len({k for k, _ in rows}) - existing
            updated = written - created
        if groups is not None:
            # The executors' drivers take ? on SQLite; Django's cursor takes %s.
            cursor.execute(loaded.hold_back_sql.replace("?", "%s"), loaded.hold_back_params)
        else:
            assert loaded.hold_back_sql == ""
        # (TEMPORARY: MariaDB/MySQL's plain DROP TABLE would commit the test's transaction.)
        cursor.execute(f"DROP {'' if can().returning else 'TEMPORARY '}TABLE delayq_load")
    return created, updated


LOCK_TOKEN = uuid.uuid4()


@pytest.mark.parametrize("on_conflict", ["ignore", "update"])
def test_bulk_load_writes_what_enqueue_many_writes(on_conflict: str, fake_clock: FakeClock) -> None:
    if not can().pipeline:
        pytest.skip("the Spark loader runs on the pipeline's databases only")
    for queue in ("by-enqueue", "by-load"):
        enqueue_many(
            queue,
            [{"v": 1}] * 5 + [{"s": "a"}],
            keys=["same", "changed", "finished", "running", "lapsed", "case"],
        )
        Message.objects.filter(queue=queue, key="finished").update(
            status="failed", next_attempt_time=None, finished_at=at(0), attempt_count=3
        )
        Message.objects.filter(queue=queue, key="running").update(
            status="running", lock_token=LOCK_TOKEN, next_attempt_time=at(30), attempt_count=1
        )
        # A lease that lapsed before the new version's due time (its worker died).
        Message.objects.filter(queue=queue, key="lapsed").update(
            status="running", lock_token=LOCK_TOKEN, next_attempt_time=at(-30), attempt_count=1
        )
    fake_clock.advance(1)
    rows = [("same", {"v": 1}), ("changed", {"v": 2}), ("finished", {"v": 2})]
    rows += [("new", {"v": 1}), ("dup", {"v": 1}), ("dup", {"v": 2})]
    # A running message's new version waits for its attempt; a payload that
    # differs only in case differs (whatever the payload column's collation).
    rows += [("running", {"v": 2}), ("lapsed", {"v": 2}), ("case", {"s": "A"})]

    results = enqueue_many(
        "by-enqueue", [p for _, p in rows], keys=[k for k, _ in rows], on_conflict=on_conflict
    )
    counts = load("by-load", rows, on_conflict)

    def table(queue: str) -> dict[str, dict[str, Any]]:
        return {
            m.key: {k: v for k, v in m.as_dict().items() if k not in ("id", "queue")}
            for m in Message.objects.filter(queue=queue)
        }

    assert table("by-load") == table("by-enqueue")
    if on_conflict == "update":
        # Not claimable before the new version's due time, nor before the lease ends.
        assert table("by-load")["lapsed"]["next_attempt_time"] == at(0)
        assert table("by-load")["running"]["next_attempt_time"] == at(29)
    # The loader counts the first occurrence of a repeated key only.
    firsts = [r.outcome for r, (k, _) in zip(results, rows, strict=True) if k != "dup"]
    firsts.append(results[4].outcome)
    assert counts == (firsts.count(CREATED), firsts.count(UPDATED))


@pytest.mark.parametrize("on_conflict", ["ignore", "update"])
def test_grouped_bulk_load_writes_and_holds_back_what_enqueue_many_does(
    on_conflict: str, fake_clock: FakeClock
) -> None:
    if not can().pipeline:
        pytest.skip("the Spark loader runs on the pipeline's databases only")
    for queue in ("by-enqueue", "by-load"):
        enqueue_many(queue, [{"v": 1}] * 3, keys=["first", "done", "other"], groups=["a", "a", "b"])
        Message.objects.filter(queue=queue, key="done").update(
            status="succeeded", next_attempt_time=None, finished_at=at(0)
        )
    fake_clock.advance(1)
    # Keys that sort against their order: a load sorted by key would reverse group c.
    rows = [("z3", {"v": 1}), ("z2", {"v": 2}), ("z1", {"v": 3}), ("done", {"v": 2})]
    rows += [("free", {"v": 1}), ("y", {"v": 1}), ("z0", {"v": 4})]
    groups = ["a", "c", "c", "a", "", "b", "c"]

    enqueue_many(
        "by-enqueue",
        [p for _, p in rows],
        keys=[k for k, _ in rows],
        groups=groups,
        on_conflict=on_conflict,
    )
    load("by-load", rows, on_conflict, groups)

    def table(queue: str) -> dict[str, dict[str, Any]]:
        return {
            m.key: {k: v for k, v in m.as_dict().items() if k not in ("id", "queue")}
            for m in Message.objects.filter(queue=queue)
        }

    def order(queue: str) -> list[tuple[str, str]]:
        return list(Message.objects.filter(queue=queue).order_by("pk").values_list("group", "key"))

    assert table("by-load") == table("by-enqueue")
    assert order("by-load") == order("by-enqueue")
    held = Message.objects.filter(queue="by-load", status="pending", next_attempt_time=None)
    waiting = {"z3", "z1", "y", "z0"} | ({"done"} if on_conflict == "update" else set())
    assert set(held.values_list("key", flat=True)) == waiting
    assert [k for g, k in order("by-load") if g == "c"] == ["z2", "z1", "z0"]


# -- the wake-up of idle workers ---------------------------------------------------------


def test_notify_body_names_the_queue_and_due_time_where_there_is_notify(
    fake_clock: FakeClock, settings: Any
) -> None:
    soon = at(0.5)
    body = wakeup.notify_body(connection, "q", soon)
    if not (can().notify or can().local_wake):
        assert body is None
        return
    assert body is not None and json.loads(body) == {"queue": "q", "due": soon.timestamp()}
    # Due after the next poll: the worker learns of it then, no NOTIFY needed.
    assert wakeup.notify_body(connection, "q", at(5)) is None
    settings.DELAYQ = {**settings.DELAYQ, "NOTIFY": False}
    assert wakeup.notify_body(connection, "q", soon) is None


def test_notify_sends_one_wake_up_where_there_is_notify(fake_clock: FakeClock) -> None:
    with CaptureQueriesContext(connection) as queries:
        wakeup.notify(connection, "q", at(0))
        wakeup.notify(connection, "q", at(3600))  # after the next poll: nothing
    sent = [q["sql"] for q in queries]
    if can().notify:
        assert len(sent) == 1 and "pg_notify" in sent[0] and wakeup.NOTIFY_CHANNEL in sent[0]
    else:
        assert sent == []


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_in_autocommit_wakes_workers_in_the_insert_itself(
    fake_clock: FakeClock,
) -> None:
    """PostgreSQL: insert and NOTIFY in one statement, one round trip."""
    with CaptureQueriesContext(connection) as queries:
        result = enqueue("q", {"v": 1}, key="k")
    assert result.outcome is CREATED
    if can().notify:
        assert len(queries) == 1 and "pg_notify" in queries[0]["sql"]
    else:
        assert not any("pg_notify" in q["sql"] for q in queries)
