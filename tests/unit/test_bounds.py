"""Every number a project gives django-delayq is bounded on both sides, and every name checked.

The numbers are found, not listed: a setting (or per-queue setting, or
handler option) is numeric when a small number passes its checks; then a
huge one, a huge negative one, infinities, NaN and ``True`` must not. A new
numeric setting or option without a bound fails here.
"""

from __future__ import annotations

import inspect
import itertools
import math
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_delayq import checks
from django_delayq.conf import DEFAULTS
from django_delayq.exceptions import HandlerNotFound
from django_delayq.registry import handler, registry

HUGE = [10**20, -(10**20), 1e300, math.inf, -math.inf, math.nan, True]
SMALL = [1, 60]


def problems(delayq: dict[str, Any]) -> list[str]:
    with override_settings(DELAYQ=delayq):
        found = [
            *checks.check_settings(),
            *checks.check_metrics(),
            *checks.check_health(),
            *checks.check_flow_limits(),
            *checks.check_schedules(),
            *checks.check_listen_database(),
            *checks.check_queue_database(),
        ]
    return [f"{p.id}: {p.msg}" for p in found if p.level >= 40]  # errors


def numeric(settings_for: Any, names: Any) -> list[str]:
    """The names that some small number passes the checks of."""
    return [n for n in names if any(not problems(settings_for(n, v)) for v in SMALL)]


TOP = numeric(lambda name, value: {name: value}, DEFAULTS)
PER_QUEUE = numeric(lambda name, value: {"QUEUES": {"default": {name: value}}}, checks.QUEUE_KEYS)


def test_the_numeric_settings_are_found():
    assert {"BATCH_SIZE", "CONCURRENCY", "PRUNE_BATCH_SIZE", "MAX_PAYLOAD_SIZE", "LEASE"} <= set(
        TOP
    )
    assert {"CONCURRENCY", "GLOBAL_CONCURRENCY", "MAX_ATTEMPTS", "LEASE"} <= set(PER_QUEUE)


@pytest.mark.parametrize(("name", "value"), list(itertools.product(TOP, HUGE)))
def test_every_numeric_setting_is_bounded(name: str, value: object):
    assert problems({name: value}), f"DELAYQ[{name!r}] = {value!r} passes the checks"


@pytest.mark.parametrize(("name", "value"), list(itertools.product(PER_QUEUE, HUGE)))
def test_every_numeric_per_queue_setting_is_bounded(name: str, value: object):
    assert problems({"QUEUES": {"default": {name: value}}}), f"{name} = {value!r} passes"


@pytest.mark.parametrize(
    ("delayq", "message"),
    [
        ({"BATCH_SIZE": 10_001}, "BATCH_SIZE must be at most 10,000"),
        ({"CONCURRENCY": 1_001}, "CONCURRENCY must be at most 1,000"),
        ({"QUEUES": {"default": {"CONCURRENCY": 10**20}}}, "CONCURRENCY must be at most 1,000"),
        ({"PRUNE_BATCH_SIZE": 10_001}, "PRUNE_BATCH_SIZE must be at most 10,000"),
        ({"MAX_PAYLOAD_SIZE": 2**40}, "MAX_PAYLOAD_SIZE must be at most 267,386,880 bytes"),
        (
            {"QUEUES": {"default": {"GLOBAL_CONCURRENCY": 10**20}}},
            "GLOBAL_CONCURRENCY must be at most 1,000,000",
        ),
    ],
)
def test_the_bounds_are_named(delayq: dict[str, Any], message: str):
    assert any(message in p for p in problems(delayq)), problems(delayq)


def test_the_largest_values_pass():
    assert not problems(
        {
            "BATCH_SIZE": 10_000,
            "CONCURRENCY": 1_000,
            "PRUNE_BATCH_SIZE": 10_000,
            "MAX_PAYLOAD_SIZE": 255 * 1024 * 1024,
            "QUEUES": {"default": {"CONCURRENCY": 1_000, "GLOBAL_CONCURRENCY": 1_000_000}},
        }
    )


# -- DELAYQ["QUEUES"] names queues -------------------------------------------------------------


def warnings_of(queues: object) -> list[tuple[str, str]]:
    with override_settings(DELAYQ={"QUEUES": queues}):
        return [(p.id, f"{p.msg} {p.hint}") for p in checks.check_queue_names()]


def test_a_queue_without_a_handler_in_queues_is_a_warning():
    ((check_id, text),) = warnings_of({"defualt": {"LEASE": 30}, "default": {"LEASE": 30}})
    assert check_id == "django_delayq.W002"
    assert "'defualt', which no handler of this project consumes" in text
    assert "did you mean 'default'?" in text
    assert warnings_of({"default": {}, "emails": {}}) == []  # a handler, a Tasks queue


def test_a_key_of_queues_that_is_no_queue_name_is_an_error():
    assert [
        (p.split(":")[0], "not a queue" in p) for p in problems({"QUEUES": {"a b": {"LEASE": 5}}})
    ] == [("django_delayq.E006", True)]


# -- handler options ---------------------------------------------------------------------------

OPTIONS = [
    name
    for name, parameter in inspect.signature(handler).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
]


def accepts(name: str, value: object) -> bool:
    """Whether ``@handler("bounds-probe", name=value)`` registers."""

    def probe(message: object) -> None: ...

    try:
        handler("bounds-probe", **{name: value})(probe)
    except (TypeError, ValueError, ImproperlyConfigured):
        return False
    finally:
        registry.unregister("bounds-probe", None)
    return True


NUMERIC_OPTIONS = [name for name in OPTIONS if any(accepts(name, v) for v in SMALL)]


def test_the_numeric_handler_options_are_found():
    assert set(NUMERIC_OPTIONS) == {
        "max_attempts",
        "lease",
        "concurrency",
        "time_limit",
        "global_concurrency",
    }


@pytest.mark.parametrize(("name", "value"), list(itertools.product(NUMERIC_OPTIONS, HUGE)))
def test_every_numeric_handler_option_is_bounded(name: str, value: object):
    assert not accepts(name, value), f"@handler(..., {name}={value!r}) is accepted"
    assert "bounds-probe" not in registry.queues()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"kind": ""}, ValueError, "kind must not be empty"),
        ({"atomic": "no"}, TypeError, "atomic must be True or False, got 'no'"),
        ({"atomic": 1}, TypeError, "atomic must be True or False"),
        ({"concurrency": True}, TypeError, "concurrency must be an integer from 1 to 1,000"),
        ({"concurrency": 3_000_000_000}, ValueError, "concurrency must be from 1 to 1,000"),
    ],
)
def test_handler_options_that_could_never_work_are_refused(
    options: dict[str, Any], error: type[Exception], message: str
):
    def probe(message: object) -> None: ...

    with pytest.raises(error, match=message):
        handler("bounds-probe", **options)(probe)
    assert "bounds-probe" not in registry.queues()
    with pytest.raises(HandlerNotFound):
        registry.lookup("bounds-probe", "")


def test_a_handler_may_still_be_atomic_and_of_a_kind():
    def probe(message: object) -> None: ...

    try:
        handler("bounds-probe", kind="k", atomic=True, concurrency=1_000)(probe)
        spec = registry.lookup("bounds-probe", "k")
        assert (spec.atomic, spec.concurrency) == (True, 1_000)
    finally:
        registry.unregister("bounds-probe", "k")


def test_a_duration_bound_is_the_same_everywhere():
    from django_delayq.conf import MAX_DELAY

    assert not accepts("lease", MAX_DELAY + timedelta(days=1))
    assert accepts("lease", MAX_DELAY)
