"""Where a lane's claims begin (``worker/floors.py``), against a model of the queue.

The model is a table of rows with due times on the database's clock:
producers whose transactions commit late (notified, or not), rows locked by
other transactions while claims pass them, a claim loop that hears the
notifications before each claim, and the maintenance thread's look below the
floors. Whatever happens, every committed row must be claimed in the end; a
row whose notification was heard, and that nobody locked, must be claimed by
the claims alone. Its database side is tested in
``tests/integration/test_floors.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from django_delayq.store import claim
from django_delayq.worker.floors import GRACE, NOTIFY_SLACK, Floors
from django_delayq.worker.inflight import Lane

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


@dataclass
class Row:
    due: datetime
    notify: bool
    commit_at: float  # the model's clock, seconds
    committed: bool = False
    locked: bool = False
    was_locked: bool = False
    claimed: bool = False
    heard: bool = False


class Table:
    """The rows, the clock, the notifications in flight, and the claim loop."""

    def __init__(self, floors: Floors, lane: Lane) -> None:
        self.floors, self.lane = floors, lane
        self.rows: list[Row] = []
        self.now = 0.0
        self.notices: dict[str, datetime] = {}

    def claimable(self, row: Row) -> bool:
        return row.committed and not row.claimed and row.due <= at(self.now)

    def tick(self, seconds: float) -> None:
        self.now += seconds
        for row in self.rows:
            if not row.committed and row.commit_at <= self.now:
                row.committed = True
                if row.notify:
                    due = self.notices.get("q")
                    # The payload's float may round the due time a microsecond up.
                    sent = row.due + timedelta(microseconds=1)
                    self.notices["q"] = sent if due is None else min(due, sent)
                    row.heard = True

    def claim(self, limit: int) -> None:
        self.floors.heard(self.notices)
        self.notices = {}
        floor, ticket = self.floors.start(self.lane)
        due = sorted(
            (
                r
                for r in self.rows
                if self.claimable(r) and not r.locked and (floor is None or r.due >= floor)
            ),
            key=lambda r: r.due,
        )[:limit]
        for row in due:
            row.claimed = True
        taken = [SimpleNamespace(last_attempt_time=at(self.now)) for _ in due]
        self.floors.claimed(self.lane, taken, limit, ticket)

    def below(self, queues, floor, **_) -> bool:
        return any(self.claimable(r) and r.due < floor for r in self.rows)


def fresh() -> tuple[Floors, Lane]:
    lane = Lane(queues=["q"], cap=4)
    floors = Floors([lane])
    floors.keep(True)
    return floors, lane


def test_a_short_claim_raises_the_floor_to_its_time_less_the_grace():
    floors, lane = fresh()
    _, ticket = floors.start(lane)
    floors.claimed(lane, [SimpleNamespace(last_attempt_time=at(10))], 5, ticket)
    assert floors.start(lane)[0] == at(10) - GRACE
    # A full claim says nothing of where the due rows end.
    _, ticket = floors.start(lane)
    floors.claimed(lane, [SimpleNamespace(last_attempt_time=at(20))] * 5, 5, ticket)
    assert floors.start(lane)[0] == at(10) - GRACE


def test_a_notification_lowers_the_floor_and_a_drop_during_a_claim_keeps_it_down():
    floors, lane = fresh()
    _, ticket = floors.start(lane)
    floors.claimed(lane, [SimpleNamespace(last_attempt_time=at(10))], 5, ticket)
    floors.heard({"q": at(3), "other": at(1)})
    assert floors.start(lane)[0] == at(3) - NOTIFY_SLACK
    _, ticket = floors.start(lane)
    floors.drop()  # the maintenance thread found a row below, while this claim ran
    floors.claimed(lane, [SimpleNamespace(last_attempt_time=at(30))], 5, ticket)
    assert floors.start(lane)[0] is None


def test_no_floor_is_kept_where_notifications_are_not_heard():
    floors, lane = fresh()
    floors.keep(False)
    _, ticket = floors.start(lane)
    floors.claimed(lane, [SimpleNamespace(last_attempt_time=at(10))], 5, ticket)
    assert floors.start(lane)[0] is None
    limited = Lane(queues=["q"], cap=1, limits=(object(),))  # type: ignore[arg-type]
    floors = Floors([lane, limited])
    floors.keep(True)
    for each in (lane, limited):
        _, ticket = floors.start(each)
        floors.claimed(each, [SimpleNamespace(last_attempt_time=at(10))], 5, ticket)
    assert floors.start(lane)[0] == at(10) - GRACE
    assert floors.start(limited)[0] is None
    # The next due time is read from the beginning: the limited lane's rows too.
    assert floors.lowest() is None
    floors = Floors([lane])
    floors.keep(True)
    _, ticket = floors.start(lane)
    floors.claimed(lane, [SimpleNamespace(last_attempt_time=at(10))], 5, ticket)
    assert floors.lowest() == at(10) - GRACE


def test_floors_are_dropped_when_notifications_stop_being_heard_not_at_every_round():
    floors, lane = fresh()
    _, ticket = floors.start(lane)
    floors.claimed(lane, [SimpleNamespace(last_attempt_time=at(10))], 5, ticket)
    floors.keep(True)  # the next round: still heard, the floor stays
    assert floors.start(lane)[0] == at(10) - GRACE
    floors.keep(False)
    assert floors.start(lane)[0] is None
    _, ticket = floors.start(lane)
    floors.keep(False)  # a polling worker's next round drops nothing (no new ticket)
    assert floors.start(lane)[1] == ticket
    assert Floors([lane]).any_lane
    assert not Floors([Lane(queues=["q"], cap=1, limits=(object(),))]).any_lane  # type: ignore[arg-type]


event = st.one_of(
    # A producer: due this many seconds from now, notified or not, committing later.
    st.tuples(
        st.just("enqueue"),
        st.floats(-5, 2),
        st.booleans(),
        st.floats(0, 4),
    ),
    st.tuples(st.just("claim"), st.integers(1, 4)),
    st.tuples(st.just("lock"), st.integers(0, 40)),
    st.tuples(st.just("unlock"), st.integers(0, 40)),
    st.tuples(st.just("tick"), st.floats(0.01, 1.5)),
    st.tuples(st.just("look"), st.none()),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(event, max_size=80))
def test_every_row_is_claimed_in_the_end_and_a_heard_one_by_the_claims_alone(events):
    floors, lane = fresh()
    table = Table(floors, lane)
    with mock.patch.object(claim, "claimable_below", table.below):
        play(table, events)


def play(table: Table, events: list) -> None:
    floors = table.floors
    for name, *arg in events:
        if name == "enqueue":
            due_in, notify, commit_in = arg
            table.rows.append(Row(at(table.now + due_in), notify, table.now + commit_in))
        elif name == "claim":
            table.claim(arg[0])
        elif name in ("lock", "unlock") and table.rows:
            row = table.rows[arg[0] % len(table.rows)]
            row.locked = name == "lock"
            row.was_locked |= row.locked
        elif name == "tick":
            table.tick(arg[0])
        elif name == "look":
            floors.below("default", lambda lane: lane.queues)
    # Every producer commits, nothing stays locked; time passes until all is due.
    for row in table.rows:
        row.locked = False
    table.tick(10)
    # The claims alone take every row that was heard of and never locked.
    for _ in range(3):
        table.claim(100)
    missed = [r for r in table.rows if r.heard and not r.was_locked and not r.claimed]
    assert not missed
    # A look below the floors, and the claims after it, take the rest.
    floors.below("default", lambda lane: lane.queues)
    table.claim(100)
    assert all(r.claimed for r in table.rows)
