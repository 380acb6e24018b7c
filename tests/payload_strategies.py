"""Hypothesis strategies of payloads: every JSON value within the documented limits,
and values just outside them (with what the refusal must name).

The limits (``payload.py``): arrays and objects nested at most
``MAX_PAYLOAD_DEPTH`` deep; no NaN or infinity, no ``-0.0``; no NUL and no
lone surrogate in a string or a key; keys are strings; only JSON's types.
The size limit (``MAX_PAYLOAD_SIZE``, 1 MiB by default) is far above what
these generate.

Profiles: ``DELAYQ_HYPOTHESIS_PROFILE=thorough`` runs 10,000 cases per
property (the default profile a modest number, for ``make test``). The
properties that run Spark take their share of that number
(:func:`spark_examples`) and do not shrink a failing example, which took
minutes of pipeline runs: the failure reports the example as found, with
what it needs to be replayed (``@reproduce_failure``).
``DELAYQ_HYPOTHESIS_SHRINK=1`` shrinks them too, when time allows.
"""

from __future__ import annotations

import math
import os
from typing import Any

import hypothesis
from hypothesis import strategies as st

from django_delayq.payload import MAX_PAYLOAD_DEPTH

_COMMON = {
    "deadline": None,
    "database": None,  # no example database written into the work tree
    "suppress_health_check": [
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.data_too_large,
    ],
}
hypothesis.settings.register_profile("delayq-default", max_examples=60, **_COMMON)
hypothesis.settings.register_profile("thorough", max_examples=10_000, **_COMMON)
PROFILE = hypothesis.settings.get_profile(
    os.environ.get("DELAYQ_HYPOTHESIS_PROFILE") or "delayq-default"
)


def examples(share: float = 1.0, least: int = 5) -> hypothesis.settings:
    """The profile's settings, with ``share`` of its examples (at least ``least``), for
    slow paths such as Spark."""
    return hypothesis.settings(PROFILE, max_examples=max(least, int(PROFILE.max_examples * share)))


def spark_examples(share: float = 1.0, least: int = 5) -> hypothesis.settings:
    """:func:`examples` for properties whose every example runs a Spark job: no shrinking
    (each step is a pipeline run; Hypothesis shrinks for up to five minutes) and no
    explaining, unless ``DELAYQ_HYPOTHESIS_SHRINK=1``; no deadline."""
    settings = examples(share, least)
    if os.environ.get("DELAYQ_HYPOTHESIS_SHRINK") == "1":
        return hypothesis.settings(settings, deadline=None)
    slow = {hypothesis.Phase.shrink, hypothesis.Phase.explain}
    return hypothesis.settings(
        settings,
        deadline=None,
        phases=[p for p in settings.phases if p not in slow],
        print_blob=True,
    )


# Any character but NUL and the lone surrogates: what every database stores.
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
FLOATS = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda x: not (x == 0 and math.copysign(1.0, x) < 0)
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    FLOATS,
    st.sampled_from([1e16, 1e308, 5e-324, 1.0, 0.0, 2.0**53, 1e-7, -1.5e300]),
    TEXT,
)


def json_values(depth: int = MAX_PAYLOAD_DEPTH) -> st.SearchStrategy[Any]:
    """Any JSON value whose arrays and objects nest at most ``depth`` deep."""
    if depth == 0:
        return SCALARS
    inner = st.deferred(lambda: json_values(depth - 1))
    return st.one_of(
        SCALARS,
        st.lists(inner, max_size=4),
        st.dictionaries(TEXT, inner, max_size=4),
    )


def deep(depth: int, leaf: Any) -> st.SearchStrategy[Any]:
    """A value exactly ``depth`` deep, in arrays or objects at random."""

    def wrap(value: Any, kinds: list[bool]) -> Any:
        for in_list in kinds:
            value = [value] if in_list else {"k": value}
        return value

    return st.lists(st.booleans(), min_size=depth, max_size=depth).map(lambda k: wrap(leaf, k))


def _inside(bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``bad`` alone, or inside an array or an object of otherwise valid values."""
    return st.one_of(
        bad,
        st.tuples(st.lists(json_values(2), max_size=3), bad).map(lambda t: [*t[0], t[1]]),
        st.tuples(TEXT, bad).map(lambda t: {"v" + t[0]: t[1]}),
    )


#: (value, what the refusal names): every kind of value outside the limits.
OUTSIDE = st.one_of(
    st.integers(MAX_PAYLOAD_DEPTH + 1, MAX_PAYLOAD_DEPTH + 40).flatmap(
        lambda d: deep(d, 1).map(lambda v: (v, "MAX_PAYLOAD_DEPTH"))
    ),
    _inside(st.sampled_from([math.nan, math.inf, -math.inf])).map(
        lambda v: (v, "which JSON cannot hold")
    ),
    _inside(st.just(-0.0)).map(lambda v: (v, "is -0.0")),
    _inside(TEXT.map(lambda t: t + "\x00")).map(lambda v: (v, "NUL")),
    _inside(st.builds(lambda t, c: t + c, TEXT, st.characters(categories=("Cs",)))).map(
        lambda v: (v, "lone surrogate")
    ),
    st.builds(lambda t, c: {t + c: 1}, TEXT, st.characters(categories=("Cs",))).map(
        lambda v: (v, "lone surrogate")
    ),
    st.builds(lambda t: {t + "\x00": 1}, TEXT).map(lambda v: (v, "NUL")),
    _inside(st.sampled_from([{1: "x"}, {None: 1}])).map(lambda v: (v, "keys must be strings")),
    _inside(st.sampled_from([b"x", {1, 2}, object()])).map(lambda v: (v, "not JSON-serialisable")),
)
