"""The contract of ``store/groups.py``: ordered groups, on every database.

Tests that take the ``table`` fixture run on ``Message`` and on the test
app's ``QueueFields`` model (``Shipment``), the two kinds of table every
change serves (``tables.py``). Times are the test clock's (``fake_clock``),
which is also the clock the store writes into its statements.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection

from django_delayq import clock
from django_delayq.models import Message
from django_delayq.store import groups, retention, sql, ticks
from tests.conftest import FakeClock
from tests.store.tables import MESSAGE, analyze, at, can, copies
from tests.testapp.models import Shipment

pytestmark = pytest.mark.django_db


def test_group_clear_lets_only_the_first_message_of_a_group_run(fake_clock: FakeClock) -> None:
    first = MESSAGE.add(group="g")
    second = MESSAGE.add(group="g")
    other = MESSAGE.add(group="h")
    free = MESSAGE.add()
    clear = Message.objects.filter(
        groups.group_clear(Message, ["q"], clock.sql_now(), using="default")
    )
    assert set(clear.values_list("pk", flat=True)) == {first, other, free}
    # A running message (live lease) keeps every other message of its group waiting,
    # an earlier one too.
    MESSAGE.set(second, status="running", next_attempt_time=at(60))
    assert set(clear.values_list("pk", flat=True)) == {other, free}
    # Once its lease has run out, the earlier message may run again.
    MESSAGE.set(second, next_attempt_time=at(-1))
    assert set(clear.values_list("pk", flat=True)) == {first, other, free}


def test_group_clear_lets_a_failed_message_block_or_not(settings: Any) -> None:
    MESSAGE.add(group="g", status="failed", due=None)
    later = MESSAGE.add(group="g")
    clear = Message.objects.filter(
        groups.group_clear(Message, ["q"], clock.sql_now(), using="default")
    )
    assert later not in set(clear.values_list("pk", flat=True))
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"q": {"GROUP_AFTER_FAILURE": "continue"}}}
    clear = Message.objects.filter(
        groups.group_clear(Message, ["q"], clock.sql_now(), using="default")
    )
    assert later in set(clear.values_list("pk", flat=True))


def _due_of_a_group() -> Any:
    """Three messages of group "g", and the claim's pick of them (due, group clear)."""
    for _ in range(3):
        MESSAGE.add(group="g")
    return (
        Message.objects.filter(queue="q")
        .due()
        .filter(groups.group_clear(Message, ["q"], clock.sql_now(), using="default"))
    )


@pytest.mark.skipif(
    "connection.vendor != 'mysql'",
    reason="PostgreSQL runs the probes in delayq_group_clear (the next test); SQLite plans "
    "with the unique (queue, key) index",
)
def test_group_clear_probes_the_group_index(fake_clock: FakeClock) -> None:
    plan = str(_due_of_a_group().explain())
    assert "delayq_group_idx" in plan, plan


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'",
    reason="the planner's use of a partial index for a bound condition: PostgreSQL's",
)
def test_the_group_function_probes_the_group_index_and_the_claim_plans_no_probe(
    fake_clock: FakeClock,
) -> None:
    clear = _due_of_a_group()
    # The claim's own plan holds no subquery: planning it costs what an
    # ungrouped claim's does (the probes were planned with every claim).
    assert "SubPlan" not in str(clear.explain()), clear.explain()
    # The function's probes, as the server runs them with a kept (generic)
    # plan: each reads the group index. Without the index's own condition
    # PostgreSQL read the primary key's range below each candidate (every
    # older message) instead.
    from django_delayq.store.features import features

    create = sql.statement("create_group_clear", features(connection))
    body = create[create.index("RETURN NOT") + len("RETURN") : create.index(";\nEND")]
    names = ["row_queue", "row_group", "row_id", "at", "failed_blocks"]
    for number, name in enumerate(names, 1):
        body = re.sub(rf"\b{name}\b", f"${number}", body)
    columns = {"queue": "queue", "group": "group", "status": "status", "id": "id"}
    body = body.format(
        table=connection.ops.quote_name(Message._meta.db_table),
        due=connection.ops.quote_name("next_attempt_time"),
        **{
            k: connection.ops.quote_name(Message._meta.get_field(v).column)
            for k, v in columns.items()
        },
    )
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # the table is small
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(
            f"PREPARE probes(varchar, varchar, bigint, timestamptz, boolean) AS SELECT {body}"
        )
        cursor.execute("EXPLAIN EXECUTE probes('q', 'g', 3, now(), true)")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE probes")
    assert plan.count("delayq_group_idx") == 2, plan
    assert "pkey" not in plan, plan


@pytest.mark.django_db(transaction=True)
def test_migration_0010_creates_the_group_function_where_the_claim_calls_it_and_reverses() -> None:
    from django.core.management import call_command

    from django_delayq.store.features import features

    def exists() -> bool:
        if connection.vendor != "postgresql":
            return False
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_proc WHERE proname = 'delayq_group_clear'")
            return bool(cursor.fetchone()[0])

    assert exists() == features(connection).group_function == (connection.vendor == "postgresql")
    try:
        call_command("migrate", "django_delayq", "0009", verbosity=0)
        assert not exists()
        groups.install_group_function(connection)
        assert exists() == features(connection).group_function
        groups.install_group_function(connection, remove=True)
        assert not exists()
    finally:
        call_command("migrate", "django_delayq", verbosity=0)
    assert exists() == features(connection).group_function


@pytest.mark.django_db(transaction=True)
def test_migration_0011_creates_the_holder_function_and_reverses() -> None:
    from django.core.management import call_command

    from django_delayq.store.features import features

    def exists() -> bool:
        if connection.vendor != "postgresql":
            return False
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_proc WHERE proname = 'delayq_holder_gone'")
            return bool(cursor.fetchone()[0])

    assert exists() == features(connection).group_function
    try:
        call_command("migrate", "django_delayq", "0010", verbosity=0)
        assert not exists()
        groups.install_holder_function(connection)
        assert exists() == features(connection).group_function
        groups.install_holder_function(connection, remove=True)
        assert not exists()
    finally:
        call_command("migrate", "django_delayq", verbosity=0)
    assert exists() == features(connection).group_function


def test_hold_back_holds_what_an_earlier_message_of_its_group_holds_back() -> None:
    head = MESSAGE.add(group="g")
    done = MESSAGE.add(group="h", status="succeeded", due=None)
    behind = MESSAGE.add(group="g")
    alone = MESSAGE.add(group="h")
    rows = {m.pk: m for m in Message.objects.filter(pk__in=[head, behind, alone])}
    assert groups.hold_back(rows, using="default") == {behind}
    assert MESSAGE.state(behind)["next_attempt_time"] is None
    assert MESSAGE.state(head)["next_attempt_time"] is not None
    assert MESSAGE.state(done)["status"] == "succeeded"
    assert groups.hold_back({}, using="default") == set()


def test_hold_back_loaded_holds_what_the_load_wrote_behind_its_group() -> None:
    if not can().pipeline:
        pytest.skip("the Spark loader's statement, for the pipeline's databases")
    written = at(10)  # the load's updated_at: what it created or rewrote
    head = MESSAGE.add(group="g", key="head")
    behind = MESSAGE.add(group="g", key="b", updated_at=written)
    alone = MESSAGE.add(group="h", key="c", updated_at=written)
    kept = MESSAGE.add(group="g", key="x", updated_at=at(0))  # loaded, but left alone
    other = MESSAGE.add(group="g", key="d", updated_at=written)  # not in this batch
    plain = MESSAGE.add(key="e", updated_at=written)
    elsewhere = MESSAGE.add(group="g", key="b2", queue="q2", updated_at=written)
    MESSAGE.add(group="g", key="h2", queue="q2")  # holds b2 back, in its own queue
    loaded = " UNION ALL ".join(f"SELECT '{k}'" for k in ("b", "c", "x", "e", "b2"))
    sql, params = groups.hold_back_loaded(connection, "q", loaded, written)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    due = {pk for pk in MESSAGE.pks() if MESSAGE.state(pk)["next_attempt_time"] is not None}
    assert due >= {head, alone, kept, other, plain, elsewhere}
    assert behind not in due


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's planner")
def test_on_sqlite_the_loaders_hold_back_probes_each_group_through_its_index() -> None:
    # The Spark loader's hold-back, as its executors run it (plain sqlite3): with
    # the statuses bound, SQLite could not use the partial delayq_group_idx, and
    # each loaded row's probe read every message of the queue.
    from django_delayq.store import loader, new_rows

    shared = new_rows.template("q", kind="", priority=0, due=at(0), max_attempts=None, now=at(0))
    load = loader.bulk_load(connection, shared, "ignore", grouped=True)
    connection.ensure_connection()
    raw = connection.connection
    raw.execute("CREATE TEMP TABLE IF NOT EXISTS delayq_load (ord INTEGER, key TEXT, grp TEXT)")
    try:
        rows = raw.execute("EXPLAIN QUERY PLAN " + load.hold_back_sql, load.hold_back_params)
        plan = "\n".join(str(row) for row in rows.fetchall())
    finally:
        raw.execute("DROP TABLE temp.delayq_load")
    assert "delayq_group_idx" in plan, plan
    assert load.hold_back_params == ()


def test_release_groups_lets_the_next_message_go_once_the_one_before_is_done(
    fake_clock: FakeClock,
) -> None:
    head = MESSAGE.add(group="g")
    later = at(30)
    behind = MESSAGE.add(group="g", due=None, scheduled_time=later)
    last = MESSAGE.add(group="g", due=None)
    assert groups.release_groups([("q", "g")]) == 0  # the head is still pending
    MESSAGE.set(head, status="succeeded", next_attempt_time=None)
    assert groups.release_groups([("q", "g")]) == 1
    assert MESSAGE.state(behind)["next_attempt_time"] == later  # its own due time
    assert MESSAGE.state(last)["next_attempt_time"] is None
    assert groups.release_groups([]) == 0


def test_release_groups_without_groups_sweeps_every_group(fake_clock: FakeClock) -> None:
    for group in ("a", "b"):
        MESSAGE.add(group=group, status="cancelled", due=None)
        MESSAGE.add(group=group, due=None, scheduled_time=at(-5))
    blocked = MESSAGE.add(group="c", status="failed", due=None)
    waiting = MESSAGE.add(group="c", due=None)
    assert groups.release_groups() == 2
    assert MESSAGE.state(waiting)["next_attempt_time"] is None
    assert MESSAGE.state(blocked)["status"] == "failed"
    # A held message whose time has passed becomes due now.
    assert Message.objects.filter(group="a", status="pending").get().next_attempt_time == at(0)


# More groups than a statement takes parameters: 65,535 on PostgreSQL with
# server-side binding (DELAYQ_TEST_PREPARED=1), 32,766 on SQLite; MariaDB's
# bound is its packet (megabytes), so there a few batches' worth checks the
# same code.
MANY_GROUPS = {"postgresql": 65_536, "sqlite": 32_767}.get(connection.vendor, 1_500)
SQLITE_DEFAULT_VARIABLES = 32_766


@pytest.fixture
def parameter_limit() -> Any:
    """SQLite's default cap on a statement's parameters (SQLITE_MAX_VARIABLE_NUMBER),
    whatever the build of the library at hand (Debian's allows 250,000)."""
    if connection.vendor != "sqlite":
        yield
        return
    import sqlite3

    connection.ensure_connection()
    raw = connection.connection
    before = raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_DEFAULT_VARIABLES)
    yield
    raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, before)


def test_release_groups_lets_go_past_more_groups_than_a_statement_takes_parameters(
    fake_clock: FakeClock, parameter_limit: None
) -> None:
    """Every blocked group's first message once went into one ``pk IN (...)``: beyond
    the parameter limit the sweep failed at every turn, and held messages whose
    release a crash had missed were never let go."""
    blocked = MESSAGE.add(key="bf0", group="b0", status="failed", due=None)
    copies(blocked, MANY_GROUPS, key="bf", group="b")
    behind = MESSAGE.add(key="bh0", group="b0", due=None)
    copies(behind, MANY_GROUPS, key="bh", group="b")
    # Groups whose first message is done: their held one (more than a batch) goes on.
    done = MESSAGE.add(key="rs0", group="r0", status="succeeded", due=None)
    copies(done, 1_000, key="rs", group="r")
    held = MESSAGE.add(key="rh0", group="r0", due=None, scheduled_time=at(-5))
    copies(held, 1_000, key="rh", group="r")
    analyze()
    freed = 1_001

    def due(prefix: str) -> int:
        return Message.objects.filter(key__startswith=prefix, next_attempt_time=at(0)).count()

    assert groups.release_groups() == freed
    assert (due("rh"), due("bh")) == (freed, 0)
    assert groups.release_groups() == 0

    Message.objects.filter(key__startswith="rh").update(next_attempt_time=None)
    pairs = {("q", f"b{i}") for i in range(MANY_GROUPS + 1)}
    pairs |= {("q", f"r{i}") for i in range(freed)}
    assert groups.release_groups(pairs) == freed
    assert (due("rh"), due("bh")) == (freed, 0)


def test_hold_back_looks_at_more_messages_than_a_statement_takes_parameters(
    parameter_limit: None,
) -> None:
    """``enqueue_many`` of that many grouped messages hands them all to hold_back.

    Each of the many is the first of its group, in a queue of its own: on
    SQLite the probe for an earlier message reads its queue's rows (it
    cannot use the partial group index with bound values), and one queue of
    all of them would make this test quadratic.
    """
    blocked = MESSAGE.add(key="f0", group="g0", status="failed", due=None)
    behind = {MESSAGE.add(key=f"h{i}", group="g0") for i in range(3)}
    first = MESSAGE.add(key="n0", group="n0", queue="n0")
    copies(first, MANY_GROUPS, key="n", group="n", queue="n")
    analyze()
    written = {
        pk: SimpleNamespace(queue=queue)
        for pk, queue in Message.objects.exclude(pk=blocked).values_list("pk", "queue")
    }
    assert len(written) > MANY_GROUPS
    assert groups.hold_back(written, using="default") == behind
    held = Message.objects.filter(next_attempt_time__isnull=True, status="pending")
    assert set(held.values_list("pk", flat=True)) == behind


# Every change given a list that can grow without bound, with more values
# than a statement binds (the list is a queryset's ids, or a batch size);
# hold_back has a test of its own above, one queue per message.
BOUNDLESS: dict[str, Callable[[list[int]], int]] = {
    "delete_ticks": lambda ids: ticks.delete_ticks(ids, using="default"),
    "cancel_ticks": lambda ids: ticks.cancel_ticks(
        ids, reason="Missed", now=clock.now(), using="default"
    ),
    "prune": lambda ids: retention.prune(at(1), batch_size=len(ids) + 10),
    "release_groups": lambda ids: groups.release_groups({("q", f"g{i}") for i in range(len(ids))}),
}


@pytest.mark.parametrize("name", BOUNDLESS)
def test_no_change_binds_a_parameter_per_value_of_an_unbounded_list(
    name: str, fake_clock: FakeClock, parameter_limit: None
) -> None:
    finished = name == "prune"
    template = MESSAGE.add(
        key="m0",
        group="g0",
        due=None if finished else at(60),
        status="succeeded" if finished else "pending",
        finished_at=at(-1) if finished else None,
    )
    copies(template, MANY_GROUPS, key="m", group="g")
    analyze()
    ids = list(Message.objects.values_list("pk", flat=True))
    assert len(ids) > MANY_GROUPS
    done = BOUNDLESS[name](ids)
    left = Message.objects.count()
    assert (done, left) == {
        "delete_ticks": (len(ids), 0),
        "cancel_ticks": (len(ids), len(ids)),
        "prune": (len(ids), 0),
        "release_groups": (0, len(ids)),
    }[name]
    if name == "cancel_ticks":
        assert not Message.objects.exclude(status="cancelled").exists()


def test_the_sweep_lets_groups_go_on_past_a_failure_only_where_their_queue_says_so(
    settings: Any, fake_clock: FakeClock
) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"c": {"GROUP_AFTER_FAILURE": "continue"}}}
    for queue in ("q", "c"):
        MESSAGE.add(queue=queue, group="g", status="failed", due=None)
        MESSAGE.add(queue=queue, group="g", due=None, key=f"behind-{queue}")
    assert groups.release_groups() == 1
    released = Message.objects.filter(next_attempt_time__isnull=False, status="pending")
    assert list(released.values_list("key", flat=True)) == ["behind-c"]


def test_groups_of_names_the_groups_of_a_selection() -> None:
    MESSAGE.add(group="g")
    MESSAGE.add(group="g")
    MESSAGE.add(queue="other", group="g")
    MESSAGE.add()
    assert groups.groups_of(Message.objects.all()) == {("q", "g"), ("other", "g")}
    assert groups.groups_of(Shipment.objects.all()) == set()


def test_wake_tells_listening_workers_on_postgresql(transactional_db: None) -> None:
    if connection.vendor != "postgresql":
        groups.wake(["q"])  # nothing to tell, nothing fails
        return
    import json

    from tests.pooler import direct_connect

    with direct_connect(autocommit=True) as listener:  # a session of its own
        listener.execute("LISTEN django_delayq")
        groups.wake(["q", "r"])
        heard = {json.loads(n.payload)["queue"] for n in listener.notifies(timeout=5, stop_after=2)}
    assert heard == {"q", "r"}


# -- SQLite: the claim's probes of a group use its index ---------------------------------


def _claim_work(queue: str, backlog: int) -> tuple[int, str]:
    """The virtual machine steps SQLite runs for one claim of 8 among ``backlog`` due
    messages of as many groups (each group also has a second message waiting), and the
    statement's plan."""
    from datetime import timedelta

    from django_delayq import enqueue_many
    from django_delayq.store import claim

    groups_ = [f"g{n}" for n in range(backlog)]
    enqueue_many(queue, [{} for _ in groups_ * 2], groups=groups_ * 2)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    sent: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append((sql, params))  # as sent: bound parameters stay bound
        return execute(sql, params, many, context)

    connection.ensure_connection()
    raw = connection.connection
    raw.set_progress_handler(count, 100)
    try:
        with connection.execute_wrapper(capture):
            claimed = claim.claim([queue], 8, worker="w", lease=timedelta(seconds=30))
    finally:
        raw.set_progress_handler(None, 0)
    assert len(claimed.messages) == 8
    sql, params = sent[-1]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        plan = "\n".join(str(row) for row in cursor.fetchall())
    return steps, plan


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's planner")
def test_on_sqlite_the_claim_probes_each_group_through_its_index() -> None:
    # SQLite uses a partial index only for conditions written into the statement:
    # with the statuses bound, each probe read every row of the queue, and a claim
    # among 11,000 due grouped messages took 108 s under the write lock.
    _, plan = _claim_work("q", 20)
    assert plan.count("delayq_group_idx") == 2, plan
    assert "sqlite_autoindex_django_delayq_message" not in plan, plan
    # Read in claim order: the pick stops at its limit rather than test and
    # sort every due message of the queue.
    assert "delayq_claim_idx" in plan and "TEMP B-TREE" not in plan, plan


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's planner")
def test_on_sqlite_a_claims_work_hardly_grows_with_the_grouped_backlog() -> None:
    # Counted in the database engine's own steps, not in seconds. It was
    # sixteen times the work for four times the backlog (a probe read the
    # whole queue), then about four times (every due message was tested
    # against its group, and all of them sorted). Read in claim order, a
    # claim of 8 tests 8; what still grows is the index entries of the held
    # second messages (no due time: SQLite sorts them first), skipped without
    # a probe or a sort: about twice, here.
    small, _ = _claim_work("small", 250)
    large, _ = _claim_work("large", 1000)
    assert large < 3 * small, (small, large)


def _release_work(queue: str, backlog: int) -> int:
    """SQLite's steps to let the next message of one group go, beside ``backlog`` other
    groups of two messages each."""
    from django_delayq import enqueue_many

    names = [f"g{n}" for n in range(backlog)]
    results = enqueue_many(queue, [{} for _ in names * 2], groups=names * 2)
    Message.objects.filter(pk=results[0].message.pk).update(status="succeeded")
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    connection.ensure_connection()
    raw = connection.connection
    raw.set_progress_handler(count, 1)
    try:
        released = groups.release_groups([(queue, "g0")])
    finally:
        raw.set_progress_handler(None, 0)
    assert released == 1
    return steps


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's planner")
def test_on_sqlite_letting_a_group_go_on_reads_that_group_only() -> None:
    # Done after every success of a grouped message: with its statuses bound it
    # read every row of the queue, so draining a queue of groups was quadratic.
    small = _release_work("small", 250)
    large = _release_work("large", 1000)
    assert large < 2 * small, (small, large)
