"""django-delayq, as a project uses it: ``enqueue``/``enqueue_many`` and ``run_delayq``.

    python -m benchmarks.systems.delayq <metric> --db NAME ...

Handlers are in ``benchmarks/benchapp/handlers.py`` (``noop``, and ``write``
with ``atomic=True``); the worker runs with the product's defaults apart
from ``--concurrency``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from benchmarks.systems.common import System, main

SETTINGS = "benchmarks.settings"


class DelayQ(System):
    name = "delayq"
    worker_env = {"DJANGO_SETTINGS_MODULE": SETTINGS}

    def __init__(self, url: str) -> None:
        super().__init__(url)
        os.environ["BENCH_DATABASE_URL"] = url
        os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
        import django

        django.setup()

    def install(self) -> None:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        self.sql("CREATE TABLE bench_sink (id bigserial PRIMARY KEY, n bigint NOT NULL)")

    def enqueue_one(self, i: int, queue: str = "noop") -> None:
        from django_delayq import enqueue

        # Outside any atomic block enqueue() is its own transaction, as the
        # raw loop's INSERT is (autocommit).
        enqueue(queue, {"i": i})

    def enqueue_delayed(self, i: int, run_at: Any) -> None:
        from django_delayq import enqueue

        enqueue("noop", {"i": i}, run_at=run_at)

    def enqueue_batch(self, n: int) -> None:
        from django_delayq import enqueue_many

        enqueue_many("noop", [{"i": i} for i in range(n)])

    def fill(self, n: int, *, future: bool = False, queue: str = "noop") -> None:
        self.sql(
            """
            INSERT INTO django_delayq_message (
                queue, key, kind, payload, status, priority, next_attempt_time,
                scheduled_time, attempt_count, last_error, last_traceback,
                error_fingerprint, locked_by, created_at, updated_at
            )
            SELECT %(queue)s, %(prefix)s || g, '', jsonb_build_object('i', g), 'pending', 0,
                   now() + %(days)s * interval '1 day', now() + %(days)s * interval '1 day',
                   0, '', '', '', '', now(), now()
            FROM generate_series(1, %(n)s) g
            """,
            {"queue": queue, "prefix": "f-" if future else "d-", "days": int(future), "n": n},
        )

    def enqueue_chain(self, n: int) -> None:
        from django.db import transaction

        from django_delayq import enqueue

        with transaction.atomic():
            previous = enqueue("noop", {"i": 0})
            for i in range(1, n):
                previous = enqueue("noop", {"i": i}, after=[previous])

    def enqueue_fan(self, n: int, *, child: bool) -> None:
        from django.db import transaction

        from django_delayq import enqueue, enqueue_many

        with transaction.atomic():
            parents = enqueue_many("noop", [{"i": i} for i in range(n)])
            if child:
                enqueue("noop", {"i": "child"}, after=parents)

    def enqueue_fan_in_child(self, n: int) -> float:
        import time

        from django_delayq import enqueue
        from django_delayq.models import Message

        parents = list(Message.objects.filter(queue="noop").only("pk")[:n])
        started = time.perf_counter()
        enqueue("noop", {"i": "child"}, after=parents)
        return time.perf_counter() - started

    def enqueue_and_wait(self, i: int, queue: str) -> None:
        from django_delayq import enqueue, wait

        wait(enqueue(queue, {"i": i}), timeout=30)

    def worker_command(self, *, concurrency: int, queue: str = "noop") -> list[str]:
        return [
            sys.executable, "-m", "django", "run_delayq",
            "--queue", queue, "--concurrency", str(concurrency), "-v0",
        ]  # fmt: skip

    def burst_command(self, queue: str = "noop") -> list[str] | None:
        return [*self.worker_command(concurrency=1, queue=queue), "--burst"]

    def processed_ok(self, n: int, queue: str) -> int:
        from django_delayq.models import Message

        return Message.objects.filter(queue=queue, status="succeeded").count()

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


if __name__ == "__main__":
    main(DelayQ)
