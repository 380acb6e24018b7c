"""Flow control's configuration (``flow.py``): rates, caps, group names, and which
limits apply to a queue and its kinds.

What the claim does with them is in ``tests/integration/test_limits.py`` and
``tests/integration/test_groups.py``.
"""

from datetime import timedelta

import pytest

from django_delayq import handler
from django_delayq.flow import (
    GROUP_MAX_LENGTH,
    MAX_RATE,
    FlowError,
    Rate,
    Scope,
    check_group,
    failure_blocks,
    limits_of,
    parse_cap,
    parse_rate,
)
from django_delayq.registry import registry
from tests.testapp.models import Shipment

SECOND, MINUTE, HOUR = timedelta(seconds=1), timedelta(minutes=1), timedelta(hours=1)


# -- rates ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("1/s", Rate(1, SECOND)),
        ("100/m", Rate(100, MINUTE)),
        ("5/h", Rate(5, HOUR)),
        (" 100/m ", Rate(100, MINUTE)),  # surrounding whitespace
        ("100 / m", Rate(100, MINUTE)),  # and around the slash
        ("\t7/s\n", Rate(7, SECOND)),
        ("010/s", Rate(10, SECOND)),  # leading zeros
        (f"{MAX_RATE}/s", Rate(MAX_RATE, SECOND)),
    ],
)
def test_a_rate_is_a_count_per_second_minute_or_hour(text, rate):
    assert parse_rate(text) == rate


@pytest.mark.parametrize(
    "text",
    ["10/d", "10/M", "10/S", "10/min", "10/sec", "10", "/s", "10/", "", "   ", "x/s", "1.5/s"]
    + ["-1/s", "+1/s", "1e3/s", "1_000/s", "10/s/s", "10 per s", "1 0/s", "١٠/s"],
)
def test_a_text_that_is_not_a_rate_is_refused(text):
    with pytest.raises(FlowError, match="is not a rate: write 'N/s', 'N/m' or 'N/h'"):
        parse_rate(text)


@pytest.mark.parametrize(
    "text", ["0/s", "00/m", f"{MAX_RATE + 1}/s", "999999999/h", "1" * 5000 + "/s"]
)
def test_a_count_out_of_range_is_refused(text):
    with pytest.raises(FlowError, match=f"the count must be from 1 to {MAX_RATE}"):
        parse_rate(text)


@pytest.mark.parametrize("value", [10, 1.5, True, None, b"10/s", ["10/s"], Rate(1, SECOND)])
def test_a_rate_must_be_a_str(value):
    with pytest.raises(
        FlowError, match=f"must be a str such as '100/m', got {type(value).__name__}"
    ):
        parse_rate(value)


def test_a_rate_error_names_the_option_and_is_a_value_error():
    with pytest.raises(ValueError, match="^RATE_LIMIT '0/s'"):
        parse_rate("0/s", "RATE_LIMIT")
    with pytest.raises(FlowError, match="^rate_limit must be a str"):
        parse_rate(5)


def test_a_rate_shows_as_it_is_written():
    assert [str(parse_rate(t)) for t in (" 5 / s", "010/m", "1/h")] == ["5/s", "10/m", "1/h"]


# -- caps -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 3, 10**6])
def test_a_cap_is_a_positive_int(value):
    assert parse_cap(value) == value


@pytest.mark.parametrize("value", [0, -1, True, False, 2.0, 1.5, "3", None, [3]])
def test_anything_else_is_not_a_cap(value):
    with pytest.raises(FlowError, match=r"^global_concurrency must be a positive integer, got"):
        parse_cap(value)


def test_a_cap_error_names_the_option():
    with pytest.raises(FlowError, match="^GLOBAL_CONCURRENCY must be a positive integer, got 0"):
        parse_cap(0, "GLOBAL_CONCURRENCY")


# -- group names ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["", "order-42", "é" * GROUP_MAX_LENGTH, " spaced ", "Order-42", "a/b:c"]
)
def test_a_group_is_a_str_of_at_most_200_characters(name):
    assert check_group(name) == name  # kept as given: no stripping, no case folding


def test_a_group_is_measured_in_characters_not_bytes():
    assert GROUP_MAX_LENGTH == 200
    assert check_group("€" * 200) == "€" * 200  # 600 bytes in UTF-8
    with pytest.raises(ValueError, match="group is 201 characters, over 200"):
        check_group("€" * 201)


@pytest.mark.parametrize("value", [None, 42, b"order-42", ["order-42"], 4.2])
def test_a_group_must_be_a_str(value):
    with pytest.raises(TypeError, match=f"group must be a str, got {type(value).__name__}"):
        check_group(value)


def test_a_group_with_a_nul_is_refused_and_errors_say_where():
    with pytest.raises(ValueError, match=r"^group contains a NUL character"):
        check_group("a\x00b")
    with pytest.raises(ValueError, match=r"^message 3: group contains a NUL"):
        check_group("\x00", "message 3: ")
    with pytest.raises(TypeError, match=r"^message 0: group must be a str"):
        check_group(1, "message 0: ")


# -- @handler options -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"rate_limit": "5/d"}, "rate_limit '5/d' is not a rate"),
        ({"rate_limit": "0/s"}, "the count must be from 1 to 100000"),
        ({"rate_limit": 5}, "rate_limit must be a str"),
        ({"rate_limit": ""}, "rate_limit '' is not a rate"),
        ({"global_concurrency": 0}, "global_concurrency must be a positive integer, got 0"),
        ({"global_concurrency": True}, "global_concurrency must be a positive integer, got True"),
        ({"global_concurrency": 2.0}, "global_concurrency must be a positive integer, got 2.0"),
        ({"global_concurrency": "2"}, "global_concurrency must be a positive integer, got '2'"),
    ],
)
def test_the_decorator_refuses_a_bad_limit_before_it_registers_anything(options, error):
    with pytest.raises(ValueError, match=error):
        handler("flow-unit", **options)
    assert registry.for_queue("flow-unit") == []


@pytest.mark.parametrize(
    "options",
    [
        {"rate_limit": "5/s"},
        {"global_concurrency": 2},
        {"rate_limit": "1/h", "global_concurrency": 1},
    ],
)
def test_a_models_handler_takes_no_global_limit(options):
    with pytest.raises(
        ValueError, match="a model's handler takes no rate_limit or global_concurrency"
    ):
        handler("flow-unit-rows", model=Shipment, **options)
    assert registry.for_model(Shipment).queue == "shipments"  # the suite's, untouched


def test_a_models_handler_with_a_bad_limit_is_told_about_the_limit_first():
    with pytest.raises(FlowError, match="rate_limit '5/d' is not a rate"):
        handler("flow-unit-rows", model=Shipment, rate_limit="5/d")


def test_a_models_handler_without_limits_is_accepted():
    assert callable(handler("flow-unit-rows", model=Shipment, rate_limit=None))


@pytest.fixture
def register():
    """Register handlers for the test's own queues; unregistered afterwards."""
    added: list[tuple[str, str | None]] = []

    def add(queue: str, kind: str | None = None, **options: object) -> None:
        handler(queue, kind=kind, **options)(lambda message: None)
        added.append((queue, kind))

    yield add
    for queue, kind in added:
        registry.unregister(queue, kind)


def test_the_handlers_spec_holds_the_parsed_limits(register):
    register("flow-unit", rate_limit=" 30 / m", global_concurrency=4)
    [spec] = registry.for_queue("flow-unit")
    assert (spec.rate_limit, spec.global_concurrency) == (Rate(30, MINUTE), 4)


# -- which limits apply ---------------------------------------------------------------


def queues(settings, **per_queue: dict[str, object]) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": per_queue}


def test_a_queue_without_limits_has_none(settings, register):
    register("flow-unit")
    queues(settings, **{"flow-unit": {"CONCURRENCY": 2, "GROUP_AFTER_FAILURE": "continue"}})
    assert limits_of("flow-unit") == []
    assert limits_of("no-such-queue") == []


def test_the_settings_limit_the_whole_queue(settings):
    queues(settings, **{"flow-unit": {"RATE_LIMIT": "100/m", "GLOBAL_CONCURRENCY": 3}})
    assert limits_of("flow-unit") == [Scope("flow-unit", "", Rate(100, MINUTE), 3)]
    assert limits_of("flow-unit-other") == []  # a queue's settings are its own


def test_a_setting_of_none_is_no_limit(settings):
    queues(settings, **{"flow-unit": {"RATE_LIMIT": None, "GLOBAL_CONCURRENCY": None}})
    assert limits_of("flow-unit") == []


def test_a_catch_all_handlers_limit_wins_over_the_setting_key_by_key(settings, register):
    register("flow-unit", rate_limit="5/s")
    queues(settings, **{"flow-unit": {"RATE_LIMIT": "100/m", "GLOBAL_CONCURRENCY": 3}})
    # The handler's rate replaces the setting's; the setting's cap still holds.
    assert limits_of("flow-unit") == [Scope("flow-unit", "", Rate(5, SECOND), 3)]


def test_a_kinds_handler_limits_its_kind_only(settings, register):
    register("flow-unit", kind="webhook", rate_limit="2/s")
    register("flow-unit", kind="audit", global_concurrency=1)
    register("flow-unit", kind="plain")
    register("flow-unit")
    queues(settings, **{"flow-unit": {"GLOBAL_CONCURRENCY": 8}})
    assert limits_of("flow-unit") == [
        Scope("flow-unit", "", None, 8),  # the queue's, for every kind
        Scope("flow-unit", "audit", None, 1),  # then the kinds', by name
        Scope("flow-unit", "webhook", Rate(2, SECOND), None),
    ]


def test_a_kinds_limit_alone_leaves_the_queue_unlimited(register):
    register("flow-unit", kind="webhook", global_concurrency=2)
    assert limits_of("flow-unit") == [Scope("flow-unit", "webhook", None, 2)]
    assert Scope("flow-unit", "webhook").name == "flow-unit/webhook"
    assert Scope("flow-unit").name == "flow-unit"


def test_a_bad_setting_is_an_error_when_the_limits_are_read(settings):
    # manage.py check reports it first (E007); a worker would not start.
    queues(settings, **{"flow-unit": {"RATE_LIMIT": "100/d"}})
    with pytest.raises(FlowError, match="RATE_LIMIT '100/d' is not a rate"):
        limits_of("flow-unit")


def test_failures_block_their_group_unless_the_queue_says_continue(settings):
    queues(
        settings,
        **{
            "goes-on": {"GROUP_AFTER_FAILURE": "continue"},
            "stops": {"GROUP_AFTER_FAILURE": "block"},
        },
    )
    assert failure_blocks("stops") and failure_blocks("unset")
    assert not failure_blocks("goes-on")
