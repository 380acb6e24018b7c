"""No thread of a worker dies unseen: each death is logged and the thread replaced, and a
part that keeps dying stops the worker with an error (``background.Supervisor``).

The faults here are errors of the worker's own code (a bug), injected once or for
good into the thread's loop; what the project's code raises is guarded before it
gets that far (``tests/integration/test_seams.py``).
"""

from __future__ import annotations

import logging
import threading

import pytest

from django_delayq import enqueue_many
from django_delayq.exceptions import WorkerCrashed
from django_delayq.models import Message, WorkerState
from django_delayq.worker import Worker
from django_delayq.worker.acks import Settler
from django_delayq.worker.execute import Result
from django_delayq.worker.keeper import Keeper
from django_delayq.worker.runner import Runner
from tests.conftest import finishes_within, wait_for
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


class Bug(Exception):
    """Stands for an error in the worker's own code."""


def once(function, error=Bug):
    """``function``, which raises ``error`` on its first call."""
    calls: list[int] = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise error("injected")
        return function(*args, **kwargs)

    wrapped.calls = calls  # type: ignore[attr-defined]
    return wrapped


def test_a_keeper_that_dies_is_started_again_and_keeps_the_worker_alive(
    monkeypatch, settings, caplog
):
    settings.DELAYQ = {**settings.DELAYQ, "HEARTBEAT_INTERVAL": 0.2, "WORKER_DEAD_AFTER": 1}
    turn = once(Keeper._turn)
    monkeypatch.setattr(Keeper, "_turn", lambda self: turn(self))
    worker = Worker(["default"], concurrency=1)
    thread = threading.Thread(target=worker.run, daemon=True)
    with caplog.at_level(logging.WARNING, logger="django_delayq.worker"):
        thread.start()
        try:
            wait_for(lambda: len(turn.calls) > 3, message="the keeper to turn again")
            name = worker.name
            before = WorkerState.objects.get(name=name).last_seen
            wait_for(
                lambda: WorkerState.objects.get(name=name).last_seen > before,
                message="a heartbeat from the new keeper",
            )
            messages = [r.message for r in enqueue_many("default", [{}, {}])]
            wait_for(
                lambda: (
                    Message.objects.filter(
                        pk__in=[m.pk for m in messages], status="succeeded"
                    ).count()
                    == 2
                ),
                message="the worker to go on",
            )
        finally:
            worker.stop()
            thread.join(60)
    assert not thread.is_alive()
    assert "lease keeper thread delayq-keeper died: Bug: injected" in caplog.text
    assert "starting the worker's lease keeper thread again" in caplog.text


def test_a_part_that_keeps_dying_stops_the_worker_with_an_error(monkeypatch, caplog):
    def broken(self):
        raise Bug("for good")

    monkeypatch.setattr(Keeper, "_turn", broken)
    worker = Worker(["default"], concurrency=1)
    worker.keeper.interval = 0.01
    with caplog.at_level(logging.WARNING, logger="django_delayq.worker"):
        with pytest.raises(WorkerCrashed, match="lease keeper thread died 4 times"):
            finishes_within(60, worker.run)
    assert "stopping the worker" in caplog.text
    assert WorkerState.objects.get(name=worker.name).stopped_at is not None


def test_an_acknowledgement_thread_that_dies_loses_nothing(monkeypatch, caplog):
    # The async lane's outcomes are all written by the settler, on every database.
    flush = once(Settler._flush)
    monkeypatch.setattr(Settler, "_flush", lambda self, *a: flush(self, *a))
    results = enqueue_many("async", [{}] * 5)
    with caplog.at_level(logging.WARNING, logger="django_delayq.worker"):
        stats = finishes_within(60, Worker(["async"], burst=True, concurrency=1).run)
    assert flush.calls, "the settler never flushed"
    assert stats[Result.SUCCEEDED] == 5
    assert set(Message.objects.values_list("status", flat=True)) == {"succeeded"}
    assert Effect.objects.count() == len(results)  # none ran twice
    assert "acknowledgement thread delayq-acks died: Bug: injected" in caplog.text


def test_an_executor_that_dies_hands_its_message_back_and_is_replaced(monkeypatch, caplog):
    run_single = once(Runner._run_single)
    monkeypatch.setattr(Runner, "_run_single", lambda self, item: run_single(self, item))
    messages = [r.message for r in enqueue_many("default", [{}, {}, {}])]
    with caplog.at_level(logging.WARNING, logger="django_delayq.worker"):
        stats = finishes_within(60, Worker(["default"], burst=True, concurrency=1).run)
    assert "executor thread delayq-executor-0 died: Bug: injected" in caplog.text
    assert "starting the worker's executor thread again" in caplog.text
    assert stats[Result.SUCCEEDED] == 3
    rows = Message.objects.filter(pk__in=[m.pk for m in messages])
    assert set(rows.values_list("status", flat=True)) == {"succeeded"}
    # The one in hand when it died went back, its attempt spent, and ran again.
    assert sorted(rows.values_list("attempt_count", flat=True)) == [1, 1, 2]
