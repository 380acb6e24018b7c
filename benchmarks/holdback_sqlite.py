"""The Spark loader's hold-back of grouped rows on SQLite, with its constants bound
and written into the statement (``store/loader.py``), on one batch of loaded rows.

    python -m benchmarks.holdback_sqlite [--rows 20000]

Rows come in groups of two, so half of them wait behind their group. SQLite
uses the partial ``delayq_group_idx`` only for a condition whose statuses are
written into the statement; bound, each loaded row's probe of its group
reads the whole queue. Prints each form's time; the database is a
throwaway file.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    n = parser.parse_args().rows
    path = os.path.join(tempfile.mkdtemp(), "holdback.sqlite3")
    os.environ["BENCH_DATABASE_URL"] = f"sqlite:///{path}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from django_delayq.store import groups, loader, new_rows
    from django_delayq.store.features import features
    from django_delayq.store.sql import statement

    call_command("migrate", verbosity=0)
    now = timezone.now()
    at = connection.ops.adapt_datetimefield_value(now)
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO django_delayq_message (queue, key, kind, payload, status, priority, "
            "next_attempt_time, scheduled_time, attempt_count, last_error, last_traceback, "
            "error_fingerprint, locked_by, created_at, updated_at, message_group) "
            "VALUES ('q', %s, '', '{}', 'pending', 0, %s, %s, 0, '', '', '', '', %s, %s, %s)",
            [(f"k{i}", at, at, at, at, f"g{i // 2}") for i in range(n)],
        )
    shared = new_rows.template("q", kind="", priority=0, due=now, max_attempts=None, now=now)
    written_in = loader.bulk_load(connection, shared, "ignore", grouped=True)
    bound_sql, bound_params = groups.hold_back_loaded(
        connection, "q", statement("loaded_keys", features(connection)), shared.updated_at
    )
    raw = connection.connection
    raw.execute("CREATE TEMP TABLE delayq_load (ord INTEGER, key TEXT, grp TEXT)")
    raw.executemany("INSERT INTO temp.delayq_load (key) VALUES (?)", [(f"k{i}",) for i in range(n)])
    for name, sql, params in (
        ("statuses bound", bound_sql.replace("%s", "?"), bound_params),
        ("written in (the loader's)", written_in.hold_back_sql, written_in.hold_back_params),
    ):
        raw.execute("SAVEPOINT s")
        started = time.perf_counter()
        held = raw.execute(sql, params).rowcount
        elapsed = time.perf_counter() - started
        raw.execute("ROLLBACK TO s")
        raw.execute("RELEASE s")
        print(f"{name}: {elapsed * 1000:,.0f} ms for {n:,} loaded rows ({held:,} held)")


if __name__ == "__main__":
    main()
