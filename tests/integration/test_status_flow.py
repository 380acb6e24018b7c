"""``delayq_status``: the flow control table (limits, how close, throttled, held, blocked)."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from django_delayq import enqueue, enqueue_many
from django_delayq.flow import limits_of
from django_delayq.store import claim, settle
from django_delayq.store.limits import claim_limited

pytestmark = pytest.mark.django_db

LEASE = timedelta(minutes=5)


def status(*args: str) -> list[str]:
    out = StringIO()
    call_command("delayq_status", *args, stdout=out)
    return out.getvalue().splitlines()


def table(lines: list[str], first_column: str) -> dict[str, list[str]]:
    """The rows of the table whose header starts with ``first_column``, by first cell."""
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first_column])
    rows = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        if line.startswith("blocked groups of"):
            break
        rows[line.split()[0]] = line.split()
    return rows


@pytest.fixture
def flows(settings, fake_clock):
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"default": {"RATE_LIMIT": "3/h"}}}
    enqueue_many("default", [{}] * 5)
    assert len(claim_limited(["default"], 10, limits_of("default"), worker="w", lease=LEASE)
               .claim.messages) == 3  # fmt: skip
    for group in ("g1", "g2"):
        enqueue_many("other", [{}] * 3, group=group)
    heads = claim.claim(["other"], 10, worker="w", lease=LEASE)
    for message in heads.messages:
        settle.fail(message.pk, heads.token, error="app.Boom: 1", retry_at=None, retry_in=LEASE)


def test_status_prints_limits_closeness_throttled_held_and_blocked(flows):
    lines = status()
    assert lines[lines.index("") + 1].split() == [
        "flow", "rate", "started", "cap", "running", "throttled", "held", "blocked",
    ]  # fmt: skip
    rows = table(lines, "flow")
    assert rows["default"] == ["default", "3/h", "3", "-", "-", "yes", "0", "0"]
    assert rows["other"] == ["other", "-", "-", "-", "-", "no", "4", "2"]
    assert "blocked groups of other: g1, g2" in lines
    # The queue table says the queue is throttled.
    queues = table(lines, "queue")
    assert queues["default"][-2:] == ["active,", "throttled"]
    assert queues["other"][-1] == "active"


def keep_in_window() -> None:
    """Move the starts a claim recorded an hour ahead: a 5/s window read after a
    slow second (a loaded machine) still holds them. What is read is the count."""
    from django_delayq import clock
    from django_delayq.models import FlowStart

    FlowStart.objects.update(started_at=clock.sql_now_plus(timedelta(hours=1)))


def test_status_prints_a_row_per_limited_kind(fake_clock):
    # tests/testapp/handlers.py: "limited" runs at most 2 at once, its webhooks 5/s.
    enqueue_many("limited", [{}] * 3, kind="webhook")
    claim_limited(
        ["limited"], 10, limits_of("limited"), worker="w", lease=LEASE, kinds=(["webhook"], True)
    )
    keep_in_window()
    rows = table(status(), "flow")
    assert rows["limited"] == ["limited", "-", "-", "2", "2", "yes", "0", "0"]
    assert rows["limited/webhook"] == ["limited/webhook", "5/s", "2", "-", "-", "no"]


def test_the_blocked_names_are_capped(flows, monkeypatch):
    from django_delayq import flowstats

    monkeypatch.setattr(flowstats, "BLOCKED_NAMES", 1)
    assert "blocked groups of other: g1 and 1 more" in status()


def test_no_flow_table_without_limits_or_groups_in_the_queues_shown():
    enqueue("default", {})
    enqueue_many("other", [{}] * 2, group="g")
    assert not any(line.startswith("flow") for line in status("--queue", "default"))
    rows = table(status(), "flow")
    assert list(rows) == ["other"]  # "limited" has no message: not shown
    assert rows["other"][-2:] == ["1", "0"]
