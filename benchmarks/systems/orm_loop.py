"""What a team writes by hand: a Django ORM ``select_for_update(skip_locked=True)`` loop.

    benchmarks/.venv-peers/bin/python -m benchmarks.systems.orm_loop <metric> ...
    benchmarks/.venv-peers/bin/python -m benchmarks.systems.orm_loop worker --queue Q

One job per transaction (claim, run, delete), threads for concurrency, and
a one-second sleep when the queue is empty (no LISTEN/NOTIFY). It has no
one-shot mode: the burst start-up row is not applicable.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from benchmarks.systems.common import System, main

SETTINGS = "benchmarks.peer_settings"
IDLE_SLEEP = 1.0


def _setup(url: str | None = None) -> None:
    if url:
        os.environ["BENCH_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django

    django.setup()


class OrmLoop(System):
    name = "orm-loop"
    worker_env = {"DJANGO_SETTINGS_MODULE": SETTINGS}

    def __init__(self, url: str) -> None:
        super().__init__(url)
        _setup(url)

    def install(self) -> None:
        from django.core.management import call_command

        call_command("migrate", run_syncdb=True, verbosity=0)

    def enqueue_one(self, i: int, queue: str = "noop") -> None:
        from django.db import transaction
        from django.utils import timezone

        from benchmarks.peerapp.models import Job

        with transaction.atomic():
            Job.objects.create(queue=queue, payload={"i": i}, run_at=timezone.now())

    def enqueue_delayed(self, i: int, run_at: Any) -> None:
        from benchmarks.peerapp.models import Job

        Job.objects.create(queue="noop", payload={"i": i}, run_at=run_at)

    def enqueue_batch(self, n: int) -> None:
        from django.utils import timezone

        from benchmarks.peerapp.models import Job

        now = timezone.now()
        Job.objects.bulk_create(
            [Job(queue="noop", payload={"i": i}, run_at=now) for i in range(n)], batch_size=5000
        )

    def fill(self, n: int, *, future: bool = False, queue: str = "noop") -> None:
        self.sql(
            "INSERT INTO peerapp_job (queue, payload, run_at) "
            "SELECT %s, jsonb_build_object('i', g), now() + %s * interval '1 day' "
            "FROM generate_series(1, %s) g",
            (queue, int(future), n),
        )

    def worker_command(self, *, concurrency: int, queue: str = "noop") -> list[str]:
        return [
            sys.executable, "-m", "benchmarks.systems.orm_loop", "worker",
            "--queue", queue, "--concurrency", str(concurrency),
        ]  # fmt: skip

    def processed_ok(self, n: int, queue: str) -> int:
        from django.utils import timezone

        from benchmarks.peerapp.models import Job

        return n - Job.objects.filter(queue=queue, run_at__lte=timezone.now()).count()

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


def _loop(queue: str) -> None:
    from django.db import transaction
    from django.utils import timezone

    from benchmarks.peerapp.models import Job, Sink
    from benchmarks.systems import probe

    while True:
        with transaction.atomic():
            job = (
                Job.objects.select_for_update(skip_locked=True)
                .filter(queue=queue, run_at__lte=timezone.now())
                .order_by("run_at")
                .first()
            )
            if job is not None:
                probe.tick(job.payload.get("i"))
                if queue == "write":
                    Sink.objects.create(n=job.pk)
                elif queue == "sleep":
                    time.sleep(0.001)
                job.delete()
        if job is None:
            time.sleep(IDLE_SLEEP)


def worker(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--queue", default="noop")
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    _setup()
    from benchmarks.systems import probe

    probe.ready()
    threads = [
        threading.Thread(target=_loop, args=(args.queue,), daemon=True)
        for _ in range(args.concurrency)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(sys.argv[2:])
    else:
        main(OrmLoop)
