"""Cron schedules against the real database: installing, replacing, removing, catching up."""

import threading
import uuid
from datetime import UTC, datetime, timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import hypothesis
import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.db import DatabaseError, connection
from django.test import override_settings
from hypothesis import strategies as st

from django_delayq import enqueue
from django_delayq.checks import check_schedules, check_settings
from django_delayq.cron import install
from django_delayq.cron.declared import get_schedules
from django_delayq.cron.install import install_schedules, uninstall_schedules
from django_delayq.cron.ticks import parse_key, tick_of
from django_delayq.models import Message
from tests.testapp.models import Execution

BASE = {"POLL_INTERVAL": 1, "RETRY_POLICY": "django_delayq.retry.FixedDelay"}
HOURLY = {"every": 3600, "queue": "ticks", "payload": {"report": "x"}}


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def configure(settings, **schedules):
    settings.DELAYQ = {**BASE, "SCHEDULES": schedules}


def ticks(name=None, prefix=None, **filters):
    """Tick messages of schedule ``name`` (or of one configuration: ``prefix``)."""
    prefix = prefix or (f"cron:{name}:" if name else "cron:")
    qs = Message.objects.filter(key__startswith=prefix, key__regex=r"Z$", **filters)
    return qs.order_by("next_attempt_time", "id")


def tick_times(qs):
    return [parse_key(k)[2] for k in qs.values_list("key", flat=True)]


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out, stderr=out)
    return out.getvalue()


# -- installing -------------------------------------------------------------------


@pytest.mark.django_db
def test_install_writes_the_next_ticks_once(settings):
    configure(settings, hourly={**HOURLY, "priority": 3, "max_attempts": 2})
    now = utc(2026, 6, 1, 10, 30)
    report = install_schedules(now)
    assert report.created == 3
    sched = get_schedules()["hourly"]
    rows = list(ticks("hourly"))
    assert [m.key for m in rows] == [sched.tick_key(utc(2026, 6, 1, h)) for h in (11, 12, 13)]
    for m in rows:
        assert m.queue == "ticks" and m.status == "pending"
        assert m.payload == {"report": "x"}, "the handler gets the schedule's payload untouched"
        assert (m.priority, m.max_attempts) == (3, 2)
        assert m.next_attempt_time == m.scheduled_time == parse_key(m.key)[2]
    again = install_schedules(now)
    assert again.created == 0 and ticks("hourly").count() == 3
    later = install_schedules(now + timedelta(hours=1))
    assert later.created == 1
    assert tick_times(ticks("hourly")) == [utc(2026, 6, 1, h) for h in (11, 12, 13, 14)]


@pytest.mark.django_db(transaction=True)
def test_concurrent_installers_never_create_a_tick_twice(settings):
    configure(settings, fast={"every": 2, "queue": "ticks"}, hourly=HOURLY)
    now = utc(2026, 6, 1, 10, 0, 1)
    barrier = threading.Barrier(6)
    reports = []
    errors = []

    def install():
        try:
            barrier.wait(timeout=30)
            reports.append(install_schedules(now))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=install) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    fast = tick_times(ticks("fast"))
    assert len(fast) == len(set(fast)) == 60  # 10:00:02 .. 10:02:00, two intervals ahead
    assert fast[0] == utc(2026, 6, 1, 10, 0, 2)
    assert ticks("hourly").count() == 3
    assert sum(r.created for r in reports) == 63, "each tick created by exactly one installer"


@pytest.mark.django_db
def test_changed_configuration_replaces_pending_ticks_and_leaves_started_ones(settings):
    configure(settings, hourly={**HOURLY, "ahead": 5})
    install_schedules(utc(2026, 6, 1, 10, 30))
    old = get_schedules()["hourly"]
    by_hour = {t.hour: m for t, m in zip(tick_times(ticks("hourly")), ticks("hourly"), strict=True)}
    Message.objects.filter(pk=by_hour[11].pk).update(status="succeeded", attempt_count=1)
    Message.objects.filter(pk=by_hour[12].pk).update(attempt_count=1, last_error="boom")
    Message.objects.filter(pk=by_hour[13].pk).update(
        status="running", attempt_count=1, lock_token=uuid.uuid4()
    )

    configure(settings, hourly={**HOURLY, "ahead": 5, "payload": {"report": "y"}})
    new = get_schedules()["hourly"]
    assert new.config_hash != old.config_hash
    report = install_schedules(utc(2026, 6, 1, 13, 10))
    assert report.results[0].replaced == 2  # 14:00 and 15:00, never started

    left_old = ticks(prefix=old.key_prefix)
    assert {(t.hour, m.status) for t, m in zip(tick_times(left_old), left_old, strict=True)} == {
        (11, "succeeded"),
        (12, "pending"),
        (13, "running"),
    }
    fresh = ticks(prefix=new.key_prefix)
    assert tick_times(fresh) == [utc(2026, 6, 1, h) for h in (14, 15, 16, 17, 18)]
    assert {m.payload["report"] for m in fresh} == {"y"}


@pytest.mark.django_db
def test_removed_schedule_loses_its_pending_ticks_only(settings):
    configure(settings, hourly=HOURLY, other={"every": 600, "queue": "ticks"})
    install_schedules(utc(2026, 6, 1, 10, 30))
    running = ticks("hourly").first()
    Message.objects.filter(pk=running.pk).update(status="running", attempt_count=1)
    lookalike = enqueue("ticks", {}, key="cron:hourly:not-a-tick").message
    other_before = set(ticks("other").values_list("pk", flat=True))

    configure(settings, other={"every": 600, "queue": "ticks"})
    report = install_schedules(utc(2026, 6, 1, 10, 31))
    assert report.removed == 2
    assert list(ticks("hourly").values_list("pk", "status")) == [(running.pk, "running")]
    assert Message.objects.filter(pk=lookalike.pk).exists(), "not a tick key: left alone"
    assert other_before <= set(ticks("other").values_list("pk", flat=True))


@pytest.mark.django_db
def test_uninstall_deletes_pending_ticks_by_name(settings):
    configure(settings, hourly=HOURLY, other={"every": 600, "queue": "ticks"})
    install_schedules(utc(2026, 6, 1, 10, 30))
    started = ticks("hourly").first()
    Message.objects.filter(pk=started.pk).update(status="running", attempt_count=1)
    assert uninstall_schedules(["hourly"]) == 2
    assert list(ticks("hourly").values_list("pk", flat=True)) == [started.pk]
    others = ticks("other").count()
    assert others == 3
    assert uninstall_schedules() == others
    assert not ticks("other").exists()
    assert ticks("hourly").count() == 1, "started ticks survive uninstall"


# -- running ticks: the worker installs, catches up, and tells the handler -------------


@pytest.fixture
def at(fake_clock):
    def move(moment: datetime) -> datetime:
        fake_clock.current = moment
        return moment

    return move


def executed_ticks():
    ids = Execution.objects.values_list("message_id", flat=True)
    return sorted(tick_of(m).time for m in Message.objects.filter(pk__in=ids))


@pytest.mark.django_db(transaction=True)
def test_worker_installs_at_start_and_runs_each_tick_when_due(settings, at, run_worker):
    configure(settings, hourly=HOURLY)
    at(utc(2026, 6, 1, 10, 30))
    run_worker(["ticks"])
    assert ticks("hourly").count() == 3 and not Execution.objects.exists()
    at(utc(2026, 6, 1, 11, 0))
    run_worker(["ticks"])
    assert executed_ticks() == [utc(2026, 6, 1, 11)]
    message = ticks("hourly", status="succeeded").get()
    tick = tick_of(message)
    assert (tick.name, tick.time, tick.late_by, tick.is_late) == (
        "hourly",
        utc(2026, 6, 1, 11),
        timedelta(0),
        False,
    )
    assert message.payload == {"report": "x"}


@pytest.mark.django_db(transaction=True)
def test_a_late_tick_says_so(settings, at, run_worker):
    configure(settings, hourly=HOURLY)
    at(utc(2026, 6, 1, 10, 30))
    run_worker(["ticks"])
    at(utc(2026, 6, 1, 11, 2))
    run_worker(["ticks"])
    tick = tick_of(ticks("hourly", status="succeeded").get())
    assert tick.late_by == timedelta(minutes=2) and tick.is_late


@pytest.mark.django_db(transaction=True)
def test_skip_drops_ticks_missed_while_no_worker_ran(settings, at, run_worker):
    configure(settings, hourly=HOURLY)
    at(utc(2026, 6, 1, 10, 30))
    run_worker(["ticks"])
    at(utc(2026, 6, 1, 17, 30))  # every worker was down from 10:30 to 17:30
    run_worker(["ticks"])
    assert not Execution.objects.exists()
    missed = ticks("hourly", status="cancelled")
    assert tick_times(missed) == [utc(2026, 6, 1, h) for h in (11, 12, 13)]
    assert all(m.last_error.startswith("Missed") for m in missed)
    assert tick_times(ticks("hourly", status="pending")) == [
        utc(2026, 6, 1, h) for h in (18, 19, 20)
    ]
    at(utc(2026, 6, 1, 18, 0))
    run_worker(["ticks"])
    assert executed_ticks() == [utc(2026, 6, 1, 18)]


@pytest.mark.django_db(transaction=True)
def test_latest_runs_the_most_recent_missed_tick_once(settings, at, run_worker):
    configure(settings, hourly={**HOURLY, "catch_up": "latest"})
    at(utc(2026, 6, 1, 10, 30))
    run_worker(["ticks"])
    at(utc(2026, 6, 1, 17, 30))
    run_worker(["ticks"])
    assert executed_ticks() == [utc(2026, 6, 1, 17)]
    ran = tick_of(ticks("hourly", status="succeeded").get())
    assert ran.late_by == timedelta(minutes=30) and ran.is_late
    assert ticks("hourly", status="cancelled").count() == 3
    run_worker(["ticks"])  # a second worker start does not run it again
    assert executed_ticks() == [utc(2026, 6, 1, 17)]


@pytest.mark.django_db(transaction=True)
def test_latest_does_not_run_a_tick_from_before_the_schedule_existed(settings, at, run_worker):
    configure(settings, hourly={**HOURLY, "catch_up": "latest"})
    at(utc(2026, 6, 1, 10, 30))
    run_worker(["ticks"])
    assert not Execution.objects.exists()
    assert tick_times(ticks("hourly"))[0] == utc(2026, 6, 1, 11)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("day", "expected"),
    [
        ("2026-03-29", utc(2026, 3, 29, 1, 0)),  # spring forward: 03:00 CEST, when the gap ends
        ("2026-10-25", utc(2026, 10, 25, 0, 30)),  # fall back: the first 02:30 (CEST) only
    ],
)
def test_workers_run_a_daily_0230_paris_job_once_across_a_dst_change(
    settings, at, run_worker, day, expected
):
    configure(
        settings, nightly={"cron": "30 2 * * *", "queue": "ticks", "timezone": "Europe/Paris"}
    )
    start = datetime.fromisoformat(day).replace(tzinfo=UTC) - timedelta(hours=4)
    for step in range(2 * 30):  # a worker every half hour, around the clock change
        at(start + timedelta(minutes=30 * step))
        run_worker(["ticks"])
    paris = ZoneInfo("Europe/Paris")
    ran = [t for t in executed_ticks() if t.astimezone(paris).date().isoformat() == day]
    assert ran == [expected]
    assert all(tick_of(m).late_by == timedelta(0) for m in ticks("nightly", status="succeeded")), (
        "each ran at its tick time"
    )


FIVES = {"every": 5, "queue": "ticks"}  # grace: 5 s, the interval to the next tick


@pytest.fixture
def claims_first(monkeypatch):
    """The worker's first claims come before its first maintenance round has cancelled
    anything (a serving worker runs that round on its own thread, beside them)."""
    monkeypatch.setattr(install, "install_schedules", lambda **kwargs: install.InstallReport())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("catch_up", ["skip", "latest"])
def test_a_tick_claimed_past_its_grace_is_cancelled_not_run(
    settings, at, run_worker, claims_first, catch_up, caplog
):
    """Every worker stopped for 35 s: the ticks of 10:00:00 to 10:00:25 are past their
    grace when a worker comes back; they must not run, whichever of its threads
    comes first. The tick of 10:00:30 is late by its grace, no more, and runs, and so
    does the one due at the restart (with catch_up="latest", it is the latest)."""
    configure(settings, fives={**FIVES, "catch_up": catch_up})
    at(utc(2026, 6, 1, 10, 0))
    install_schedules()  # installed by the workers before they stopped
    at(utc(2026, 6, 1, 10, 0, 35))

    run_worker(["ticks"])

    assert executed_ticks() == [utc(2026, 6, 1, 10, 0, 30), utc(2026, 6, 1, 10, 0, 35)]
    missed = ticks("fives", status="cancelled")
    assert tick_times(missed) == [utc(2026, 6, 1, 10, 0, s) for s in range(0, 30, 5)]
    for message in missed:
        # As an installer leaves a missed tick: never attempted.
        assert message.last_error == (
            f"Missed: not started within its grace period (catch_up={catch_up})"
        )
        assert (message.attempt_count, message.last_attempt_time) == (0, None)
        assert message.finished_at == utc(2026, 6, 1, 10, 0, 35)
    lines = [r.getMessage() for r in caplog.records if "cancelled, not run" in r.getMessage()]
    assert len(lines) == 6
    assert "tick of 2026-06-01T10:00:00+00:00 missed: claimed 0:00:35 after" in lines[0]


@pytest.mark.django_db(transaction=True)
def test_latest_runs_the_newest_late_tick_once_when_claimed_before_the_install(
    settings, at, run_worker, claims_first
):
    configure(settings, hourly={**HOURLY, "catch_up": "latest", "grace": 600})
    at(utc(2026, 6, 1, 10, 30))
    install_schedules()  # 11:00, 12:00, 13:00
    at(utc(2026, 6, 1, 13, 30))  # down from 10:30: 13:00 is past its grace (10 min)

    run_worker(["ticks"])

    # 13:00 is the latest occurrence by now: catch_up="latest" runs it, once.
    assert executed_ticks() == [utc(2026, 6, 1, 13)]
    assert tick_times(ticks("hourly", status="cancelled")) == [utc(2026, 6, 1, h) for h in (11, 12)]


@pytest.mark.django_db(transaction=True)
def test_latest_leaves_the_run_to_the_latest_occurrence_when_the_ticks_ran_out(
    settings, at, run_worker, monkeypatch
):
    """The installed ticks ran out: the installer installs the latest occurrence to run
    now. A worker that claimed an older installed one first must not run it too."""
    configure(settings, hourly={**HOURLY, "catch_up": "latest"})
    at(utc(2026, 6, 1, 10, 30))
    install_schedules()  # 11:00, 12:00, 13:00
    at(utc(2026, 6, 1, 17, 30))
    real_install = install.install_schedules
    monkeypatch.setattr(install, "install_schedules", lambda **kwargs: install.InstallReport())
    run_worker(["ticks"])  # the claims came first
    monkeypatch.setattr(install, "install_schedules", real_install)
    run_worker(["ticks"])  # then the install

    assert executed_ticks() == [utc(2026, 6, 1, 17)]
    assert tick_times(ticks("hourly", status="cancelled")) == [
        utc(2026, 6, 1, h) for h in (11, 12, 13)
    ]


@pytest.mark.django_db(transaction=True)
def test_a_retry_of_a_tick_that_started_in_time_still_runs_late(settings, at, run_worker):
    configure(settings, fives=FIVES)
    at(utc(2026, 6, 1, 10, 0))
    install_schedules()
    first = ticks("fives").first()
    Message.objects.filter(pk=first.pk).update(attempt_count=1, last_error="boom")
    at(utc(2026, 6, 1, 10, 0, 40))  # its retry comes long after the grace
    run_worker(["ticks"])
    assert utc(2026, 6, 1, 10) in executed_ticks()


@pytest.mark.django_db(transaction=True)
@hypothesis.settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
    ],
)
@hypothesis.given(
    period=st.sampled_from([5, 60, 3600]),
    catch_up=st.sampled_from(["skip", "latest"]),
    grace=st.sampled_from([None, 0.5, 2.0]),  # of a period; None: the default
    down=st.floats(0, 12),  # periods every worker was stopped
)
def test_which_ticks_run_after_an_outage_does_not_depend_on_which_thread_comes_first(
    settings, at, run_worker, monkeypatch, period, catch_up, grace, down
):
    """A worker back after an outage claims and installs on two threads: the ticks that
    run (and those cancelled as missed) must be the same whichever goes first, and
    each ran within its grace, or is the latest occurrence under catch_up="latest"."""
    options = {"every": period, "queue": "ticks", "catch_up": catch_up}
    if grace is not None:
        options["grace"] = grace * period
    configure(settings, sched=options)
    (sched,) = get_schedules().values()
    stopped = utc(2026, 6, 1, 9, 59, 59)
    back = stopped + timedelta(seconds=down * period)

    def outcome(claims_first: bool) -> dict[datetime, str]:
        Message.objects.all().delete()
        Execution.objects.all().delete()
        at(stopped)
        install_schedules()
        at(back)
        if claims_first:
            with monkeypatch.context() as first:
                first.setattr(install, "install_schedules", lambda **kw: install.InstallReport())
                run_worker(["ticks"])
        run_worker(["ticks"])
        return {tick_of(m).time: m.status for m in ticks("sched") if tick_of(m).time <= back}

    installed_first = outcome(claims_first=False)
    claimed_first = outcome(claims_first=True)
    assert claimed_first == installed_first
    for message in ticks("sched", status="succeeded"):
        tick = tick_of(message)
        latest = catch_up == "latest" and sched.previous_tick(back) == tick.time
        assert tick.late_by <= sched.grace_for(tick.time) or latest, tick


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("error", [RuntimeError("bug"), DatabaseError("gone")])
def test_a_failing_install_never_stops_the_worker(settings, monkeypatch, run_worker, error):
    configure(settings, hourly=HOURLY)

    def broken(**kwargs):
        raise error

    monkeypatch.setattr(install, "install_schedules", broken)
    message = enqueue("default", {}).message
    run_worker(["default"])
    assert Message.objects.get(pk=message.pk).status == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_an_invalid_schedule_is_ignored_by_the_worker_not_fatal(settings, run_worker):
    configure(settings, hourly=HOURLY, broken={"cron": "61 * * * *", "queue": "ticks"})
    message = enqueue("default", {}).message
    run_worker(["default"])
    assert Message.objects.get(pk=message.pk).status == "succeeded"
    assert ticks("hourly").count() == 3 and not ticks("broken").exists()


# -- system checks ------------------------------------------------------------------


def schedule_errors(schedules):
    with override_settings(DELAYQ={**BASE, "SCHEDULES": schedules}):
        return [(e.id, e.msg) for e in check_schedules()]


def test_valid_schedules_pass_the_checks():
    assert (
        schedule_errors({"hourly": HOURLY, "nightly": {"cron": "0 2 * * *", "queue": "ticks"}})
        == []
    )


@pytest.mark.parametrize(
    ("options", "check_id"),
    [
        ({"cron": "0 25 * * *", "queue": "ticks"}, "django_delayq.E011"),
        (
            {"cron": "0 2 * * *", "queue": "ticks", "timezone": "Europe/Pariss"},
            "django_delayq.E012",
        ),
        ({"cron": "0 2 * * *", "every": 60, "queue": "ticks"}, "django_delayq.E013"),
        ({"every": -30, "queue": "ticks"}, "django_delayq.E014"),
        ({"every": 30, "queue": "nobody-consumes-this"}, "django_delayq.E015"),
        ({"every": 30, "queue": "ticks", "catch_up": "never"}, "django_delayq.E010"),
    ],
)
def test_bad_schedules_are_check_errors_naming_the_schedule(options, check_id):
    errors = schedule_errors({"my-job": options, "fine": HOURLY})
    assert [i for i, _ in errors] == [check_id]
    assert "'my-job'" in errors[0][1]


def test_schedules_need_aware_datetimes():
    with override_settings(USE_TZ=False):
        errors = schedule_errors({"hourly": HOURLY})
    assert [i for i, _ in errors] == ["django_delayq.E010"]
    assert "'hourly'" in errors[0][1] and "USE_TZ" in errors[0][1]


def test_schedules_must_be_a_dict():
    assert [i for i, _ in schedule_errors([HOURLY])] == ["django_delayq.E010"]


def test_install_interval_is_a_checked_duration():
    with override_settings(DELAYQ={"CRON_INSTALL_INTERVAL": 0}):
        assert [e.id for e in check_settings()] == ["django_delayq.E003"]
    with override_settings(DELAYQ={"SCHEDULES": {}, "CRON_INSTALL_INTERVAL": 30}):
        assert check_settings() == []


def test_manage_check_fails_on_a_bad_schedule():
    with (
        override_settings(
            DELAYQ={"SCHEDULES": {"nightly": {"cron": "0 2 * * *", "every": 5, "queue": "ticks"}}}
        ),
        pytest.raises(SystemCheckError, match=r"E013.*'nightly'|'nightly'.*E013"),
    ):
        call_command("check")


# -- manage.py delayq_cron --------------------------------------------------------------

NIGHTLY = {"cron": "30 2 * * *", "queue": "ticks", "timezone": "Europe/Paris"}


@pytest.mark.django_db(transaction=True)
def test_delayq_cron_lists_next_runs_in_the_schedule_time_zone_and_the_last_run(
    settings, at, run_worker
):
    configure(settings, nightly=NIGHTLY, hourly=HOURLY)
    at(utc(2026, 3, 28, 12))
    lines = run("delayq_cron").splitlines()
    assert lines[0].split()[:4] == ["name", "queue", "schedule", "timezone"]
    nightly = next(line for line in lines if line.startswith("nightly"))
    assert "cron 30 2 * * *" in nightly and "Europe/Paris" in nightly
    # The spring-forward night: 02:30 does not exist, the tick runs at 03:00 CEST.
    assert "2026-03-29 03:00:00+0200" in nightly and "2026-03-30 02:30:00+0200" in nightly
    assert nightly.rstrip().endswith("-")  # never ran

    run_worker(["ticks"])
    at(utc(2026, 3, 28, 13, 0, 5))
    run_worker(["ticks"])
    hourly = next(line for line in run("delayq_cron", "list", "hourly").splitlines()[2:])
    assert "every 1h" in hourly and "2026-03-28 13:00:05+0000" in hourly
    assert "succeeded (late by 5s)" in hourly


@pytest.mark.django_db
def test_delayq_cron_install_and_uninstall_by_hand(settings, fake_clock):
    configure(settings, nightly=NIGHTLY, hourly=HOURLY)
    out = run("delayq_cron", "install", "nightly")
    assert "nightly: 3 tick(s) installed" in out and "hourly" not in out
    assert ticks("nightly").count() == 3 and not ticks("hourly").exists()
    assert "hourly: 3 tick(s) installed" in run("delayq_cron", "install")
    assert "deleted 3 pending tick(s)" in run("delayq_cron", "uninstall", "nightly")
    assert not ticks("nightly").exists() and ticks("hourly").count() == 3
    with pytest.raises(CommandError, match="unknown schedule"):
        run("delayq_cron", "install", "nope")


@pytest.mark.django_db
def test_delayq_cron_without_schedules():
    assert run("delayq_cron").strip() == "no schedules"


# -- the admin page --------------------------------------------------------------------

SCHEDULES_URL = "/admin/django_delayq/message/schedules/"


@pytest.fixture
def scheduled(settings, fake_clock):
    configure(settings, nightly=NIGHTLY, hourly=HOURLY)
    fake_clock.current = utc(2026, 3, 28, 12)
    install_schedules()


@pytest.mark.django_db
def test_admin_schedules_page_shows_next_and_last_runs(client, scheduled):
    done = ticks("hourly").first()
    Message.objects.filter(pk=done.pk).update(
        status="failed",
        attempt_count=1,
        last_attempt_time=parse_key(done.key)[2],
        last_error="ValueError: no data",
    )
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    response = client.get(SCHEDULES_URL)
    assert response.status_code == 200
    page = response.content.decode()
    assert 'data-name="nightly"' in page and 'data-name="hourly"' in page
    assert "cron 30 2 * * *" in page and "every 1h" in page
    assert "2026-03-29 03:00:00 CEST" in page
    assert "ValueError: no data" in page and "failed" in page
    assert "key__startswith=cron%3Ahourly%3A" in page


@pytest.mark.django_db
def test_admin_schedules_link_lists_the_schedule_messages(client, scheduled):
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    response = client.get("/admin/django_delayq/message/", {"key__startswith": "cron:nightly:"})
    assert response.status_code == 200
    assert list(response.context["cl"].queryset.values_list("key", flat=True)) != []
    assert {
        k.split(":")[1] for k in response.context["cl"].queryset.values_list("key", flat=True)
    } == {"nightly"}


@pytest.mark.django_db
def test_admin_schedules_page_needs_the_view_permission(client, scheduled):
    anonymous = client.get(SCHEDULES_URL)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(SCHEDULES_URL).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_message"))
    staff = User.objects.get(pk=staff.pk)
    client.force_login(staff)
    assert client.get(SCHEDULES_URL).status_code == 200
