"""Cron schedules without a database: parsing, hashing, keys, tick times, catch-up plans."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_delayq.cron.declared import get_schedules, schedule, unregister_schedule
from django_delayq.cron.spec import ScheduleError, build_schedule, parse_schedule
from django_delayq.cron.ticks import TickRow, parse_key, plan_ticks, tick_of
from django_delayq.models import Message
from django_delayq.registry import registry

PARIS = ZoneInfo("Europe/Paris")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def local_dates(ticks, day: str) -> list[datetime]:
    return [t for t in ticks if t.astimezone(PARIS).date().isoformat() == day]


# -- parsing --------------------------------------------------------------------


def test_settings_entry_parses_into_a_schedule():
    s = parse_schedule(
        "nightly-report",
        {
            "cron": "0 2 * * *",
            "queue": "reports",
            "payload": {"kind": "daily"},
            "timezone": "Europe/Paris",
            "priority": 5,
            "max_attempts": 2,
            "catch_up": "latest",
        },
    )
    assert (s.name, s.queue, s.cron, s.every, s.timezone) == (
        "nightly-report",
        "reports",
        "0 2 * * *",
        None,
        "Europe/Paris",
    )
    assert (s.payload, s.priority, s.max_attempts, s.catch_up) == (
        {"kind": "daily"},
        5,
        2,
        "latest",
    )
    assert s.spec == "cron 0 2 * * *"


def test_every_accepts_seconds_or_timedelta_and_defaults_are_documented():
    a = parse_schedule("heartbeat", {"every": 30, "queue": "ops"})
    b = parse_schedule("heartbeat", {"every": timedelta(seconds=30), "queue": "ops"})
    assert a == b and a.every == timedelta(seconds=30) and a.spec == "every 30s"
    assert (a.payload, a.kind, a.priority, a.max_attempts) == ({}, "", 0, None)
    assert (a.catch_up, a.ahead, a.grace, a.timezone) == ("skip", 3, None, None)


def test_cron_timezone_defaults_to_the_project_time_zone():
    with override_settings(TIME_ZONE="Europe/Paris"):
        assert parse_schedule("x", {"cron": "0 2 * * *", "queue": "q"}).timezone == "Europe/Paris"


@pytest.mark.parametrize(
    ("options", "check_id", "words"),
    [
        ({"cron": "61 * * * *", "queue": "q"}, "E011", "invalid cron expression '61 * * * *'"),
        ({"cron": "61 * * * *", "queue": "q"}, "E011", "the minute field '61' is not valid (it"),
        ({"cron": "0 25 * * *", "queue": "q"}, "E011", "the hour field '25' is not valid (it"),
        ({"cron": "0 0 32 * *", "queue": "q"}, "E011", "day-of-month field '32' is not valid"),
        ({"cron": "0 0 * 13 *", "queue": "q"}, "E011", "month field '13' is not valid"),
        ({"cron": "0 0 * * mon-xyz", "queue": "q"}, "E011", "day-of-week field 'mon-xyz'"),
        ({"cron": "*/0 * * * *", "queue": "q"}, "E011", "minute field '*/0'"),
        ({"cron": "0 2 * *", "queue": "q"}, "E011", "five fields"),
        ({"cron": "*/5 * * * * 30", "queue": "q"}, "E011", "every="),
        ({"cron": "0 0 30 2 *", "queue": "q"}, "E011", "never fires"),
        ({"cron": 5, "queue": "q"}, "E011", "must be a str"),
        ({"cron": "0 2 * * *", "queue": "q", "timezone": "Mars/Olympus"}, "E012", "Mars/Olympus"),
        ({"every": 30, "queue": "q", "timezone": "UTC"}, "E012", "only applies to cron"),
        ({"cron": "0 2 * * *", "every": 30, "queue": "q"}, "E013", "both"),
        ({"queue": "q"}, "E013", "neither"),
        ({"every": 0, "queue": "q"}, "E014", "positive"),
        ({"every": timedelta(seconds=-5), "queue": "q"}, "E014", "positive"),
        ({"every": 1.5, "queue": "q"}, "E014", "whole number of seconds"),
        ({"every": 10**12, "queue": "q"}, "E014", "every must be at most 365000 days"),
        ({"every": 10**15, "queue": "q"}, "E014", "out of range"),
        ({"every": 10**10, "queue": "q", "ahead": 10}, "E014", "times ahead (10)"),
        ({"every": 30, "queue": "q", "grace": 10**15}, "E010", "grace: 1000000000000000 seconds"),
        ({"every": "30", "queue": "q"}, "E014", "timedelta"),
        ({"every": 30}, "E010", "queue is required"),
        ({"every": 30, "queue": "bad queue"}, "E010", "queue name"),
        ({"every": 30, "queue": "q", "kind": "a\x00b"}, "E010", "kind contains a NUL"),
        ({"every": 30, "queue": "q", "catch_up": "all"}, "E010", "catch_up"),
        ({"every": 30, "queue": "q", "ahead": 0}, "E010", "ahead"),
        ({"every": 30, "queue": "q", "grace": 0}, "E010", "grace"),
        ({"every": 30, "queue": "q", "priority": 40000}, "E010", "priority"),
        ({"every": 30, "queue": "q", "max_attempts": 0}, "E010", "max_attempts"),
        ({"every": 30, "queue": "q", "max_attempts": 1_000_001}, "E010", "[1, 1000000]"),
        ({"every": 30, "queue": "q", "payload": {"x": {1, 2}}}, "E010", "set"),
        ({"every": 30, "queue": "q", "evrey": 5}, "E010", "'evrey'"),
        ("every 30", "E010", "dict of options"),
    ],
)
def test_bad_schedules_raise_with_their_check_id(options, check_id, words):
    with pytest.raises(ScheduleError) as info:
        parse_schedule("job", options)
    assert info.value.check_id == f"django_delayq.{check_id}"
    assert words in str(info.value)


@pytest.mark.parametrize("name", ["", "a:b", "with space", "-x", "x" * 101, 5, "nightly\n"])
def test_names_that_would_break_key_prefixes_are_refused(name):
    with pytest.raises(ScheduleError, match="schedule name"):
        parse_schedule(name, {"every": 30, "queue": "q"})


# -- hashing and keys -------------------------------------------------------------


def test_config_hash_is_stable_across_processes_and_releases():
    s = parse_schedule("heartbeat", {"every": 30, "queue": "ops"})
    # Pinned: a new value reinstalls every deployment's ticks on upgrade.
    assert s.config_hash == build_schedule("heartbeat", queue="ops", every=30).config_hash
    assert len(s.config_hash) == 10 and int(s.config_hash, 16) >= 0
    assert s.config_hash == "628b0a20b9"


def test_config_hash_ignores_dict_order_and_install_options():
    base = {"cron": "0 2 * * *", "queue": "q", "payload": {"a": 1, "b": 2}, "timezone": "UTC"}
    same = [
        {**base, "payload": {"b": 2, "a": 1}},
        {**base, "ahead": 10},
        {**base, "grace": 60},
        {**base, "catch_up": "latest"},
    ]
    reference = parse_schedule("job", base).config_hash
    assert {parse_schedule("job", o).config_hash for o in same} == {reference}


@pytest.mark.parametrize(
    "change",
    [
        {"cron": "0 3 * * *"},
        {"timezone": "Europe/Paris"},
        {"payload": {"a": 2, "b": 2}},
        {"queue": "other"},
        {"kind": "report"},
        {"priority": 1},
        {"max_attempts": 3},
    ],
)
def test_config_hash_changes_with_anything_that_shapes_a_tick(change):
    base = {"cron": "0 2 * * *", "queue": "q", "payload": {"a": 1, "b": 2}, "timezone": "UTC"}
    assert (
        parse_schedule("job", {**base, **change}).config_hash
        != parse_schedule("job", base).config_hash
    )


def test_tick_keys_embed_name_hash_and_utc_time_and_parse_back():
    s = build_schedule(
        "nightly-report", queue="reports", cron="30 2 * * *", timezone="Europe/Paris"
    )
    tick = datetime(2026, 3, 29, 3, 0, tzinfo=PARIS)
    key = s.tick_key(tick)
    assert key == f"cron:nightly-report:{s.config_hash}:2026-03-29T01:00:00Z"
    assert key.startswith(s.key_prefix) and key.startswith(s.name_prefix)
    assert parse_key(key) == ("nightly-report", s.config_hash, utc(2026, 3, 29, 1))


@pytest.mark.parametrize(
    "key",
    [
        "welcome-42",
        "cron:x",
        "cron:x:zzzzzzzzzz:2026-03-29T01:00:00Z",
        "cron:x:0123456789:soon",
        "cron:x:0123456789:2026-03-29T01:00:00Z\n",
    ],
)
def test_other_keys_are_not_ticks(key):
    assert parse_key(key) is None
    assert tick_of(Message(key=key)) is None


def test_tick_of_tells_the_handler_its_occurrence_and_lateness():
    s = build_schedule("heartbeat", queue="ops", every=30)
    on_time = Message(
        key=s.tick_key(utc(2026, 1, 1, 0, 0, 30)), last_attempt_time=utc(2026, 1, 1, 0, 0, 30)
    )
    tick = tick_of(on_time)
    assert tick is not None
    assert (tick.name, tick.time, tick.config_hash) == (
        "heartbeat",
        utc(2026, 1, 1, 0, 0, 30),
        s.config_hash,
    )
    assert tick.late_by == timedelta(0) and not tick.is_late
    late = Message(key=on_time.key, last_attempt_time=utc(2026, 1, 1, 0, 5, 30))
    assert tick_of(late).late_by == timedelta(minutes=5)
    assert tick_of(late).is_late


# -- tick times -------------------------------------------------------------------


def test_every_is_aligned_to_the_epoch_whoever_computes_it():
    s = build_schedule("e", queue="q", every=7)
    grid_a = s.next_ticks(utc(2026, 5, 1, 12, 0, 0), 5)
    grid_b = s.next_ticks(utc(2026, 5, 1, 12, 0, 3) + timedelta(microseconds=7), 5)
    assert set(grid_b) <= set(grid_a) | set(s.next_ticks(grid_a[-1], 5))
    assert all(int(t.timestamp()) % 7 == 0 for t in grid_a + grid_b)
    assert [b - a for a, b in zip(grid_a, grid_a[1:], strict=False)] == [timedelta(seconds=7)] * 4


def test_tick_at_the_start_instant_is_included():
    s = build_schedule("e", queue="q", every=2)
    assert s.next_ticks(utc(2026, 1, 1), 2) == [utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 2)]
    assert next(s.ticks(utc(2026, 1, 1), inclusive=False)) == utc(2026, 1, 1, 0, 0, 2)
    assert s.previous_tick(utc(2026, 1, 1, 0, 0, 3)) == utc(2026, 1, 1, 0, 0, 2)


def test_cron_reads_the_expression_in_its_time_zone():
    s = build_schedule("n", queue="q", cron="0 2 * * *", timezone="Europe/Paris")
    winter, summer = s.next_ticks(utc(2026, 1, 10), 1)[0], s.next_ticks(utc(2026, 7, 10), 1)[0]
    assert (winter, summer) == (utc(2026, 1, 10, 1), utc(2026, 7, 10, 0))


def test_daily_0230_runs_once_on_the_spring_forward_day():
    # 2026-03-29, Europe/Paris: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
    s = build_schedule("n", queue="q", cron="30 2 * * *", timezone="Europe/Paris")
    ticks = s.next_ticks(utc(2026, 3, 27), 5)
    on_the_day = local_dates(ticks, "2026-03-29")
    assert len(on_the_day) == 1
    assert on_the_day[0] == utc(2026, 3, 29, 1)  # 03:00 CEST, when the gap ends
    assert [t.astimezone(PARIS).date().day for t in ticks] == [27, 28, 29, 30, 31]


def test_daily_0230_runs_once_on_the_fall_back_day():
    # 2026-10-25, Europe/Paris: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    s = build_schedule("n", queue="q", cron="30 2 * * *", timezone="Europe/Paris")
    ticks = s.next_ticks(utc(2026, 10, 23), 5)
    on_the_day = local_dates(ticks, "2026-10-25")
    assert on_the_day == [utc(2026, 10, 25, 0, 30)]  # the first 02:30 (CEST)
    assert [t.astimezone(PARIS).date().day for t in ticks] == [23, 24, 25, 26, 27]


def test_fall_back_repeat_is_skipped_even_when_starting_inside_the_repeated_hour():
    s = build_schedule("n", queue="q", cron="30 2 * * *", timezone="Europe/Paris")
    # 00:40Z is 02:40 CEST: the first 02:30 has passed; the second must not run.
    assert s.next_ticks(utc(2026, 10, 25, 0, 40), 1) == [utc(2026, 10, 26, 1, 30)]
    assert s.previous_tick(utc(2026, 10, 25, 1, 45)) == utc(2026, 10, 25, 0, 30)


def test_hourly_jobs_follow_real_time_across_dst():
    s = build_schedule("h", queue="q", cron="0 * * * *", timezone="Europe/Paris")
    spring = local_dates(s.next_ticks(utc(2026, 3, 28, 20), 40), "2026-03-29")
    fall = local_dates(s.next_ticks(utc(2026, 10, 24, 20), 40), "2026-10-25")
    assert (len(spring), len(fall)) == (23, 25)
    assert all(b - a == timedelta(hours=1) for a, b in zip(fall, fall[1:], strict=False))


def test_default_grace_is_the_interval_to_the_next_tick_at_most_an_hour():
    assert build_schedule("e", queue="q", every=30).grace_for(utc(2026, 1, 1)) == timedelta(
        seconds=30
    )
    daily = build_schedule("d", queue="q", cron="0 2 * * *", timezone="UTC")
    assert daily.grace_for(utc(2026, 1, 1, 2)) == timedelta(hours=1)
    explicit = build_schedule("d", queue="q", cron="0 2 * * *", timezone="UTC", grace=7200)
    assert explicit.grace_for(utc(2026, 1, 1, 2)) == timedelta(hours=2)


# -- catch-up plans ----------------------------------------------------------------


def rows_for(s, times, untouched=True, start_id=1):
    return [
        TickRow(start_id + i, s.queue, s.name, s.config_hash, t, untouched)
        for i, t in enumerate(times)
    ]


def test_plan_installs_ahead_from_now_and_not_what_exists():
    s = build_schedule("h", queue="q", every=3600, ahead=3)
    now = utc(2026, 1, 1, 10, 30)
    plan = plan_ticks(s, now, [], lookahead=timedelta(minutes=2))
    assert plan.install == [utc(2026, 1, 1, 11), utc(2026, 1, 1, 12), utc(2026, 1, 1, 13)]
    existing = rows_for(s, [utc(2026, 1, 1, 11), utc(2026, 1, 1, 12)])
    plan = plan_ticks(s, now, existing, lookahead=timedelta(minutes=2))
    assert plan.install == [utc(2026, 1, 1, 13)] and plan.cancel == []


def test_plan_covers_the_lookahead_for_fast_schedules():
    s = build_schedule("e", queue="q", every=2, ahead=3)
    plan = plan_ticks(s, utc(2026, 1, 1), [], lookahead=timedelta(seconds=120))
    assert len(plan.install) == 61 and plan.install[-1] == utc(2026, 1, 1, 0, 2)


def test_skip_cancels_missed_ticks_and_installs_no_past_tick():
    s = build_schedule("h", queue="q", every=3600)
    stale = rows_for(s, [utc(2026, 1, 1, h) for h in (1, 2, 3)])
    plan = plan_ticks(s, utc(2026, 1, 1, 9, 30), stale, has_history=lambda: True)
    assert plan.cancel == [1, 2, 3]
    assert plan.caught_up is None
    assert min(plan.install) == utc(2026, 1, 1, 10)


def test_a_late_tick_within_its_grace_is_kept():
    s = build_schedule("h", queue="q", every=3600)
    rows = rows_for(s, [utc(2026, 1, 1, 9), utc(2026, 1, 1, 10)])
    plan = plan_ticks(s, utc(2026, 1, 1, 9, 59), rows)
    assert plan.cancel == []


def test_started_ticks_are_never_cancelled():
    s = build_schedule("h", queue="q", every=3600)
    running = rows_for(s, [utc(2026, 1, 1, 1)], untouched=False)
    assert plan_ticks(s, utc(2026, 1, 1, 9, 30), running).cancel == []


def test_latest_keeps_the_most_recent_missed_tick_and_cancels_the_rest():
    s = build_schedule("h", queue="q", every=3600, catch_up="latest")
    stale = rows_for(s, [utc(2026, 1, 1, h) for h in (1, 2, 3)])
    future = rows_for(s, [utc(2026, 1, 1, 10)], start_id=10)
    plan = plan_ticks(s, utc(2026, 1, 1, 5, 30), stale + future)
    assert plan.cancel == [1, 2]
    assert plan.caught_up == utc(2026, 1, 1, 3)


def test_latest_keeps_no_missed_tick_once_a_later_one_ran():
    s = build_schedule("h", queue="q", every=3600, catch_up="latest")
    stale = rows_for(s, [utc(2026, 1, 1, h) for h in (1, 2, 3)])
    future = rows_for(s, [utc(2026, 1, 1, 10)], start_id=10)
    ran_at_5 = plan_ticks(
        s, utc(2026, 1, 1, 5, 30), stale + future, exists=lambda t: t == utc(2026, 1, 1, 5)
    )
    assert ran_at_5.cancel == [1, 2, 3] and ran_at_5.caught_up is None


def test_latest_installs_the_last_tick_when_the_installed_ones_ran_out():
    s = build_schedule("h", queue="q", every=3600, catch_up="latest")
    stale = rows_for(s, [utc(2026, 1, 1, h) for h in (1, 2, 3)])
    plan = plan_ticks(s, utc(2026, 1, 1, 9, 30), stale)
    assert plan.cancel == [1, 2, 3]
    assert plan.caught_up == utc(2026, 1, 1, 9)
    assert utc(2026, 1, 1, 9) in plan.install


def test_latest_catches_up_from_finished_history_but_not_for_a_new_schedule():
    s = build_schedule("h", queue="q", every=3600, catch_up="latest")
    now = utc(2026, 1, 1, 9, 30)
    assert plan_ticks(s, now, [], has_history=lambda: True).caught_up == utc(2026, 1, 1, 9)
    fresh = plan_ticks(s, now, [], has_history=lambda: False)
    assert fresh.caught_up is None and min(fresh.install) == utc(2026, 1, 1, 10)
    ran = plan_ticks(s, now, [], has_history=lambda: True, exists=lambda t: True)
    assert ran.caught_up is None


def test_latest_does_not_add_a_catch_up_when_now_is_a_tick():
    s = build_schedule("h", queue="q", every=3600, catch_up="latest")
    stale = rows_for(s, [utc(2026, 1, 1, h) for h in (1, 2, 3)])
    plan = plan_ticks(s, utc(2026, 1, 1, 9), stale)
    assert plan.caught_up is None
    assert plan.install[0] == utc(2026, 1, 1, 9)  # due now: the schedule is caught up by it
    assert plan.install == sorted(plan.install)


def test_plans_ignore_rows_of_another_configuration():
    s = build_schedule("h", queue="q", every=3600)
    other = build_schedule("h", queue="q", every=1800)
    rows = rows_for(other, [utc(2026, 1, 1, 1)])
    plan = plan_ticks(s, utc(2026, 1, 1, 9, 30), rows)
    assert plan.cancel == []


# -- declaring in code -------------------------------------------------------------


@pytest.fixture
def declared():
    names = []
    yield names
    for name in names:
        unregister_schedule(name)
    registry.unregister("code-q", None)


def test_schedule_decorator_registers_the_schedule_and_its_handler(declared):
    declared.append("from-code")

    @schedule("from-code", queue="code-q", every=60, payload={"x": 1})
    def on_tick(message):
        return message

    assert get_schedules()["from-code"].payload == {"x": 1}
    assert get_schedules()["from-code"].source == "code"
    assert registry.lookup("code-q", "").func is on_tick


def test_schedule_called_plainly_and_overridden_or_disabled_by_settings(declared):
    declared.append("plain")
    schedule("plain", queue="code-q", every=60)
    schedule("plain", queue="code-q", every=60)  # a module imported twice
    with pytest.raises(ImproperlyConfigured, match="declared twice"):
        schedule("plain", queue="code-q", every=30)
    with override_settings(DELAYQ={"SCHEDULES": {"plain": {"queue": "code-q", "every": 5}}}):
        assert get_schedules()["plain"].every == timedelta(seconds=5)
    with override_settings(DELAYQ={"SCHEDULES": {"plain": None}}):
        assert "plain" not in get_schedules()


def test_schedule_validates_at_declaration(declared):
    with pytest.raises(ScheduleError, match="unknown time zone"):
        schedule("bad", queue="code-q", cron="0 2 * * *", timezone="Nowhere/Land")
    assert "bad" not in get_schedules()


def test_invalid_setting_entries_are_left_out_not_raised():
    with override_settings(
        DELAYQ={"SCHEDULES": {"ok": {"queue": "q", "every": 5}, "bad": {"queue": "q"}}}
    ):
        assert list(get_schedules()) == ["ok"]
