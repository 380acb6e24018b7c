"""django-tasks with its database backend (django-tasks-db) and ``db_worker``.

    benchmarks/.venv-peers/bin/python -m benchmarks.systems.django_tasks_peer <metric> ...

``db_worker`` runs one task at a time (no concurrency option): the
concurrency-4 row is not applicable; two processes are. Its one-shot mode
is ``db_worker --batch``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from benchmarks.systems.common import System, main

SETTINGS = "benchmarks.peer_settings"


class DjangoTasks(System):
    name = "django-tasks-db"
    worker_env = {"DJANGO_SETTINGS_MODULE": SETTINGS}

    def __init__(self, url: str) -> None:
        super().__init__(url)
        os.environ["BENCH_DATABASE_URL"] = url
        os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
        import django

        django.setup()

    def install(self) -> None:
        from django.core.management import call_command

        call_command("migrate", run_syncdb=True, verbosity=0)

    def enqueue_one(self, i: int, queue: str = "noop") -> None:
        from django.db import transaction

        from benchmarks.peerapp import tasks

        with transaction.atomic():
            getattr(tasks, queue).enqueue(i)

    def enqueue_delayed(self, i: int, run_at: Any) -> None:
        from django.db import transaction

        from benchmarks.peerapp.tasks import noop

        with transaction.atomic():
            noop.using(run_after=run_at).enqueue(i)

    def enqueue_batch(self, n: int) -> None:
        # No batch API: one transaction around n enqueues.
        from django.db import transaction

        from benchmarks.peerapp.tasks import noop

        with transaction.atomic():
            for i in range(n):
                noop.enqueue(i)

    def fill(self, n: int, *, future: bool = False, queue: str = "noop") -> None:
        run_after = "now() + interval '1 day'" if future else "'9999-01-01 00:00:00+00'"
        self.sql(
            f"""
            INSERT INTO django_tasks_database_dbtaskresult (
                id, status, enqueued_at, args_kwargs, priority, task_path, worker_ids,
                queue_name, backend_name, run_after, exception_class_path, traceback
            )
            SELECT gen_random_uuid(), 'READY', now(),
                   jsonb_build_object('args', jsonb_build_array(g), 'kwargs', '{{}}'::jsonb),
                   0, %(path)s, '[]', %(queue)s, 'default', {run_after}, '', ''
            FROM generate_series(1, %(n)s) g
            """,
            {"n": n, "queue": queue, "path": f"benchmarks.peerapp.tasks.{queue}"},
        )

    def worker_command(self, *, concurrency: int, queue: str = "noop") -> list[str]:
        return [
            sys.executable, "-m", "django", "db_worker",
            "--queue-name", queue, "--no-startup-delay",
        ]  # fmt: skip

    def burst_command(self, queue: str = "noop") -> list[str] | None:
        # --batch: process what is outstanding, then exit (and, as in the
        # serving mode, without db_worker's random start-up sleep).
        return [*self.worker_command(concurrency=1, queue=queue), "--batch"]

    def processed_ok(self, n: int, queue: str) -> int:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM django_tasks_database_dbtaskresult "
                "WHERE queue_name = %s AND status = 'SUCCESSFUL'",
                [queue],
            )
            return int(cursor.fetchone()[0])

    def supports(self, metric: str, concurrency: int = 1) -> bool:
        return concurrency == 1

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


if __name__ == "__main__":
    main(DjangoTasks)
