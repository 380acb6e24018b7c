"""Every place the worker calls the database or the project's code, made to raise once.

For each call site of ``django_delayq/worker/`` (``tests/chaos/faults.py`` finds
them in the source) the workload runs through a worker whose call there raises
once: the worker recovers or stops with an error, never hangs, and every message
ends as it must. By default (PostgreSQL only) each site raises one exception
class (each class in turn across the sites); ``DELAYQ_FAULTS=one`` does that on
any database, and ``DELAYQ_FAULTS=all`` (``make chaos``) raises each of
``Exception``, ``DatabaseError``, ``InterfaceError``, ``asyncio.CancelledError``,
``KeyboardInterrupt`` and ``SystemExit`` at every site.

A site the workload cannot reach on this database is listed in :data:`NOT_HERE`
with the reason; one reached only once something else failed, in :data:`AFTER_A_FAULT`
with the test that covers it. A new site in neither list that the workload never
reaches fails :func:`test_every_site_is_reached`.
"""

from __future__ import annotations

import os

import pytest
from django.db import connection

from django_delayq.store.features import features
from tests.chaos.faults import Site, discover, exception_classes, run_site, settings_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

SITES = sorted(discover())


def _site(text: str) -> Site:
    module, rest = text.split(" ", 1)
    function, callee = rest.split(" -> ")
    return Site(module.removeprefix("worker/").removesuffix(".py"), function, callee)


#: Sites reached only after another fault, and where that is tested.
AFTER_A_FAULT = {
    _site("worker/runner.py _release.<locals>.release -> leases.release"): (
        "hands back an attempt whose executor died or could not write its outcome: "
        "test_supervision.py::test_an_executor_that_dies_hands_its_message_back_and_is_replaced"
    ),
    _site("worker/execute.py _write -> _settle"): (
        "its retries after a lost connection: reached whenever an outcome is written, "
        "and its own fault is the write's (the site `... -> change`)"
    ),
    _site("worker/__init__.py Worker.__init__ -> liveness.validate_worker_name"): (
        "checks a name the caller gave before the worker exists (the workload names none); "
        "its error goes to the caller: "
        "test_hostile_input.py::test_a_worker_name_that_does_not_fit_is_refused_before_the_worker_starts"
    ),
}


def not_here() -> dict[Site, str]:
    """Sites this database never reaches, with the reason."""
    can = features(connection)
    found: dict[Site, str] = {}
    batching = ["worker/acks.py Settler._acknowledge -> settle.ack_held"]
    groups = [
        "worker/runner.py Runner._ack_group -> settle.ack_held",
        "worker/runner.py Runner._run_group -> execute",
    ]
    single = [
        "worker/execute.py execute.<locals>.acknowledge -> settle.ack",
        "worker/execute.py execute -> settle.ack",
    ]
    if can.group_commits:
        for text in single:
            found[_site(text)] = "acknowledged in batches and atomic groups here"
    else:
        for text in [
            *batching,
            *groups,
            "worker/acks.py Settler._states -> leases.states",
            "worker/acks.py Settler._children_go_on -> dependencies.settle_without_waiting",
        ]:
            found[_site(text)] = "no batched acknowledgements or atomic groups here"
    # A parent's success and its children's release: one statement on PostgreSQL
    # (settle.ack_releasing), two elsewhere.
    one, two = (
        "worker/execute.py _children_go_on -> dependencies.follow_up",
        "worker/execute.py _children_go_on -> dependencies.settle_without_waiting",
    )
    if connection.vendor == "postgresql":
        found[_site(two)] = "a parent's outcome releases its children in one statement here"
    else:
        found[_site(one)] = "a parent's children are released after its outcome here"
    return found


def classes_for(index: int) -> list[type[BaseException]]:
    every = exception_classes()
    if os.environ.get("DELAYQ_FAULTS") == "all":
        return every
    return [every[index % len(every)]]


CASES = [
    pytest.param(site, error, id=f"{site}|{error.__name__}")
    for index, site in enumerate(SITES)
    for error in classes_for(index)
]


@pytest.fixture(autouse=True)
def _short_intervals(settings):
    settings.DELAYQ = settings_for(settings.DELAYQ)


@pytest.mark.parametrize(("site", "error"), CASES)
def test_a_fault_at_a_site_loses_nothing_and_stops_nothing(site, error):
    if not os.environ.get("DELAYQ_FAULTS") and connection.vendor != "postgresql":
        pytest.skip("make test runs the sites on PostgreSQL; make chaos on every database")
    if site in AFTER_A_FAULT:
        pytest.skip(AFTER_A_FAULT[site])
    if site in not_here():
        pytest.skip(not_here()[site])
    # A few sites are reached only when two threads meet in a window (the
    # keeper's extension between a theft and the thief's outcome): a run
    # that never reached the site tested nothing, and is run again.
    for _ in range(3):
        outcome = run_site(site, error)
        if outcome.fired or outcome.hung or outcome.violations:
            break
    assert outcome.fired, f"the workload never reached {site} in three runs"
    assert not outcome.hung
    assert not outcome.violations, outcome.violations


def test_every_site_is_reached_or_listed():
    """A call site added to the worker is either reached by the workload (the test
    above proves it) or listed, with its reason, here."""
    assert len(SITES) > 30
    unknown = {s for s in AFTER_A_FAULT if s not in SITES}
    assert not unknown, f"listed sites that are gone: {unknown}"
