"""Shared fixtures: a controllable clock, in-process and subprocess workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from django_delayq import clock
from django_delayq.worker import Worker


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the browser tests last.

    Playwright's sync API keeps an asyncio event loop running in the main
    thread while its (session-wide) browser is open; any later test that goes
    through ``async_to_sync`` would then refuse to run.
    """
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.scheduling import scheduler

    return scheduler(config, log)


ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _sessions_proven_per_test() -> Iterator[None]:
    """A listening worker proves its alias's sessions its own for the process
    (store/direct.py: its statements are prepared from then on); each test
    starts from what the process had proven before it."""
    from django_delayq.store import direct

    before = set(direct.SESSIONS)
    yield
    direct.SESSIONS.clear()
    direct.SESSIONS.update(before)


def wait_for(
    predicate: Callable[[], object],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
) -> object:
    """Poll ``predicate`` until it is truthy or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def finishes_within(
    seconds: float, function: Callable[[], object], describe: Callable[[], str] | None = None
) -> object:
    """``function()``'s result (or its exception), failing the test if it runs longer.

    It runs in a daemon thread, so a regression that makes it loop forever
    fails this test instead of hanging the suite (the thread is left behind).
    The failure shows where every thread of the process stood, and what
    ``describe()`` says (a worker's book and lanes): a hang seen once in a
    while can then be read from the one run that showed it.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = function()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            # The thread's own connections: left open, they keep the test
            # database from being dropped at the end of the session.
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running after {seconds} s\n{_where_threads_are(describe)}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _where_threads_are(describe: Callable[[], str] | None) -> str:
    import sys
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    if describe is not None:
        try:
            parts.append(describe())
        except Exception as exc:  # a description must not hide the timeout
            parts.append(f"(describe() failed: {exc!r})")
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame, limit=12))
        parts.append(f"--- thread {names.get(ident, ident)}\n{stack}")
    return "\n".join(parts)


def claimed_parent_and_child(**child_options: Any) -> tuple[Any, Any, Any]:
    """A workflow parent claimed (with its lock token) and a child waiting for it, on
    the ``steps`` queue: what a worker holds when it acknowledges a parent."""
    from django_delayq import enqueue
    from django_delayq.store import claim

    parent = enqueue("steps", {}, key="parent").message
    child = enqueue("steps", {}, key="child", after=[parent], **child_options).message
    taken = claim.claim(["steps"], 10, worker="w", lease=timedelta(minutes=5))
    assert [m.pk for m in taken.messages] == [parent.pk]
    return parent, child, taken.token


class FakeClock:
    def __init__(self, start: datetime) -> None:
        self.current = start

    def __call__(self) -> datetime:
        return self.current

    def advance(self, seconds: float = 0, **kwargs: float) -> datetime:
        self.current += timedelta(seconds=seconds, **kwargs)
        return self.current


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock(timezone.now())
    monkeypatch.setattr(clock, "now", fake)
    return fake


@pytest.fixture
def run_worker() -> Callable[..., object]:
    """Run an in-process worker in burst mode (needs a transactional test)."""

    def run(queues: list[str] | None = None, **kwargs: object):
        kwargs.setdefault("burst", True)
        return Worker(queues, **kwargs).run()  # type: ignore[arg-type]

    return run


@pytest.fixture
def serving_worker() -> Iterator[Callable[..., Worker]]:
    """Start in-process serving workers (not --burst) in threads; stopped at the end."""
    import threading

    started: list[tuple[Worker, threading.Thread]] = []

    def start(queues: list[str], **options: Any) -> Worker:
        worker = Worker(queues, **options)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        started.append((worker, thread))
        return worker

    yield start
    for worker, thread in started:
        worker.stop()
        thread.join(60)
        assert not thread.is_alive()


class WorkerProcess:
    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args = args
        # A file, not a pipe: a worker that logs a lot (a database outage's
        # tracebacks) must not block on a full pipe nobody reads yet.
        self._log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "run_delayq", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            # A group of its own, killed whole by stop(): a --reload watcher's
            # worker outlives a SIGKILL of the watcher, and would go on taking
            # the next test's messages from the same test database.
            start_new_session=True,
        )
        self._output: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def wait_until_consuming(self, timeout: float = 60) -> None:
        """Poll (with a deadline) the output for the line a started worker writes: a
        SIGTERM sent before the worker set its signal handlers would kill it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.printed(" consuming "):
                return
            time.sleep(0.05)
        raise AssertionError(f"the worker did not start consuming within {timeout} s")

    def printed(self, text: str) -> bool:
        """Whether the process has printed ``text`` so far (while it runs)."""
        # pread: the worker writes through the same file offset, which a
        # seek here would move under it.
        fd = self._log.fileno()
        return text.encode() in os.pread(fd, os.fstat(fd).st_size, 0)

    @property
    def output(self) -> str:
        """Everything the process printed (once it has exited)."""
        if self._output is None:
            self.proc.wait(timeout=60)
            self._log.seek(0)
            self._output = self._log.read()
            self._log.close()
        return self._output

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the group is gone: the worker and anything it started have exited
        self.proc.wait(timeout=30)
        self.output  # noqa: B018 - read and close the log


@pytest.fixture
def worker_env(transactional_db: None) -> dict[str, str]:
    """Environment for subprocesses that must use this test's database."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DELAYQ_TEST_DATABASE_NAME"] = str(connection.settings_dict["NAME"])
    if "queue" in settings.DATABASES:
        env["DELAYQ_TEST_QUEUE_DATABASE_NAME"] = str(connections["queue"].settings_dict["NAME"])
    env.setdefault("DELAYQ_LOG_LEVEL", "INFO")
    return env


@pytest.fixture
def spawn_worker(worker_env: dict[str, str]) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def spawn(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        process = WorkerProcess(list(args), {**worker_env, **(env or {})})
        started.append(process)
        return process

    yield spawn
    for process in started:
        process.stop()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """On MariaDB/MySQL, give queue and key the binary collation the README asks for.

    Behind a pooler (a "direct" alias beside it, DELAYQ_TEST_DIRECT_URL), end
    the pooler's server connections to the test database afterwards, so that
    it can be dropped.
    """
    from django_delayq.routers import queue_alias

    queue_connection = connections[queue_alias()]
    if queue_connection.vendor == "mysql":
        from django_delayq.store import server

        with django_db_blocker.unblock(), queue_connection.cursor() as cursor:
            cursor.execute(server.binary_columns_sql(queue_connection))
    yield
    if "direct" in settings.DATABASES:
        from tests.pooler import end_pooled_sessions

        end_pooled_sessions()
