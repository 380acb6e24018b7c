"""``run_delayq --reload``: a saved file gives a new worker, after the running
handlers finish; a file saved with an error waits for the next save."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_delayq import enqueue
from django_delayq.models import Message, WorkerState
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]


def _until(condition: Callable[[], object], what: str, timeout: float = 60) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def _save(module: Path, text: str) -> None:
    module.write_text(text)


def _save_until(module: Path, text: str, condition: Callable[[], object], what: str) -> object:
    """Save, and save again each second until ``condition``: a worker's watcher
    takes its first look at the files a moment after it starts, and a save
    before that look is the state it compares with, as with runserver."""
    _save(module, text)
    deadline = time.monotonic() + 60
    bump = time.time()
    while time.monotonic() < deadline:
        try:
            return _until(condition, what, timeout=1)
        except AssertionError:
            bump += 2  # later than any time the watcher has seen
            os.utime(module, (bump, bump))
    raise AssertionError(f"not within 60 s: {what}")


def _running_worker() -> WorkerState | None:
    return WorkerState.objects.filter(stopped_at__isnull=True).first()


def test_a_changed_file_reloads_the_worker_after_its_handlers_finish(
    spawn_worker, worker_env, tmp_path
):
    module = tmp_path / "reload_probe.py"
    _save(module, "VERSION = 1\n")
    env = {
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{worker_env['PYTHONPATH']}",
        "DELAYQ_TEST_IMPORT": "reload_probe",
        # The module is compiled from its source each time: a cached .pyc is
        # checked by the source's size and whole-second mtime, and the saves
        # below (same size, times moved ahead) can match a stale one, starting
        # a worker on "VERSION = 2" when the file says "VERSION = (".
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    parent = spawn_worker("--reload", "--queue", "default", env=env)
    pids: set[int] = set()
    try:
        first = _until(_running_worker, "a first worker")
        pids.add(first.pid)
        assert first.pid != parent.pid  # the worker is the child, not the watcher
        # A handler running while the file is saved finishes before the reload.
        running = enqueue("default", {"sleep": 2}).message
        _until(lambda: Execution.objects.filter(message_id=running.pk).exists(), "its start")
        _save_until(
            module,
            "VERSION = 2\n",
            lambda: WorkerState.objects.filter(pk=first.pk, stopped_at__isnull=False).exists(),
            "the first worker's stop",
        )
        running.refresh_from_db()
        assert running.status == "succeeded"
        assert Execution.objects.get(message_id=running.pk).finished is not None
        second = _until(
            lambda: (
                WorkerState.objects.filter(stopped_at__isnull=True).exclude(pk=first.pk).first()
            ),
            "a second worker",
        )
        pids.add(second.pid)
        later = enqueue("default", {}).message
        _until(lambda: Message.objects.filter(pk=later.pk, status="succeeded").exists(), "later")
        assert Execution.objects.get(message_id=later.pk).worker == str(second.pid)

        # Saved with an error: the new worker cannot start; the watcher waits
        # for the next save instead of giving up.
        _save_until(
            module,
            "VERSION = (\n",
            lambda: not WorkerState.objects.filter(stopped_at__isnull=True).exists(),
            "the second worker's stop",
        )
        _until(lambda: parent.printed("starting it again once a file changes"), "the failure")
        third = _save_until(
            module,
            "VERSION = 3\n",
            lambda: (
                WorkerState.objects.filter(stopped_at__isnull=True)
                .exclude(pk__in=[first.pk, second.pk])
                .first()
            ),
            "a third worker, once the error is fixed",
        )
        pids.add(third.pid)
        assert parent.proc.poll() is None
        parent.signal(signal.SIGTERM)  # passed on to the worker
        assert parent.wait() == 0
        _until(
            lambda: not WorkerState.objects.filter(stopped_at__isnull=True).exists(),
            "the third worker's stop",
        )
        assert "SyntaxError" in parent.output
        assert "starting it again once a file changes" in parent.output
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_reload_and_burst_are_refused_together():
    with pytest.raises(CommandError, match="--reload keeps the worker serving"):
        call_command("run_delayq", "--reload", "--burst")
