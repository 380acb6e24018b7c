"""``delayq_pipeline archive``: nothing deleted unless durably written, nothing archived twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_delayq import operations
from django_delayq.contrib.spark import PipelineError, archive_job, database, dbapi
from django_delayq.models import Message
from tests.conftest import ROOT, wait_for
from tests.pipeline.conftest import finished, run_pipeline

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

DAY = timedelta(days=1)


class Crash(BaseException):
    """Stands for the process dying: nothing in the archive code may catch it."""


def populate() -> list[int]:
    """12 finished messages old enough to archive, plus some that must stay; the old ids."""
    now = timezone.now()
    old = [
        finished(
            queue=("mail", "sms")[i % 2],
            key=f"old-{i}",
            status=("succeeded", "failed", "cancelled")[i % 3],
            finished_at=now - (2 + i % 2) * DAY - timedelta(seconds=i),
            error="ValueError: boom" if i % 3 == 1 else "",
        )
        for i in range(12)
    ]
    finished("mail", "recent", finished_at=now - timedelta(minutes=5))
    Message.objects.create(queue="mail", key="pending", scheduled_time=now, next_attempt_time=now)
    return sorted(m.pk for m in old)


def archive(dest: Path, on_stage: Callable[[str], None] | None = None) -> Any:
    options = archive_job.ArchiveOptions(dest=str(dest), older_than=24 * 3600)
    from django_delayq.contrib.spark import session

    return archive_job.run_archive(session.get_session(), options, on_stage=on_stage)


def table_ids() -> set[int]:
    return set(Message.objects.values_list("id", flat=True))


def test_archive_writes_verified_parquet_then_deletes(tmp_path: Path, read_archive: Any) -> None:
    old = populate()
    originals = {m.pk: m for m in Message.objects.filter(pk__in=old)}
    summary, output = run_pipeline(
        "archive", "--dest", str(tmp_path / "arch"), "--older-than", "86400"
    )
    assert (summary.archived, summary.deleted, summary.kept) == (12, 12, 0)
    assert "archived 12 message(s)" in output and "deleted 12 from the table" in output
    assert sorted(Message.objects.values_list("key", flat=True)) == ["pending", "recent"]

    rows = read_archive(tmp_path / "arch")
    assert [r["id"] for r in rows] == old
    for row in rows:
        original = originals[row["id"]]
        assert row["queue"] == original.queue and row["status"] == original.status
        assert row["key"] == original.key and row["last_error"] == original.last_error
        assert row["finished_at"] == original.finished_at.replace(tzinfo=None)
        assert row["date"] == original.finished_at.date()
        assert original.payload == {"key": row["key"]}
    files = sorted(p.relative_to(tmp_path / "arch") for p in (tmp_path / "arch").rglob("*.parquet"))
    assert files and all(str(f).endswith(".zstd.parquet") for f in files)
    assert {f.parts[0] for f in files} == {"queue=mail", "queue=sms"}
    assert all(f.parts[1].startswith("date=") for f in files)


def test_the_archive_is_its_owners_only_whatever_the_umask(tmp_path: Path) -> None:
    populate()
    dest = tmp_path / "arch"
    previous = os.umask(0o022)  # a common umask: files 0644, directories 0755
    try:
        summary, _ = run_pipeline("archive", "--dest", str(dest), "--older-than", "86400")
    finally:
        os.umask(previous)
    assert summary.archived == 12
    found = [dest, *dest.rglob("*")]
    assert any(p.suffix == ".parquet" for p in found)
    assert any(p.name == "done.json" for p in found)  # the journal
    wide = {
        str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777)
        for p in found
        if p.stat().st_mode & 0o077
    }
    assert wide == {}


def test_messages_changed_during_the_archive_stay(tmp_path: Path, read_archive: Any) -> None:
    old = populate()
    retried = Message.objects.filter(pk__in=old, status="failed").order_by("pk")[0]
    refinished = Message.objects.filter(pk__in=old, status="succeeded").order_by("pk")[0]

    def meanwhile(stage: str) -> None:
        if stage == "published":  # archived and published, not deleted yet
            # An operator retries a failed message from the admin ...
            operations.retry_failed(Message.objects.filter(pk=retried.pk))
            # ... and another one ran again and finished again, as old as before.
            Message.objects.filter(pk=refinished.pk).update(
                attempt_count=2, updated_at=timezone.now()
            )

    summary = archive(tmp_path / "arch", meanwhile)
    assert (summary.archived, summary.deleted, summary.kept) == (12, 10, 2)
    assert Message.objects.get(pk=retried.pk).status == "pending"
    assert Message.objects.get(pk=refinished.pk).attempt_count == 2
    assert [r["id"] for r in read_archive(tmp_path / "arch")] == old


def test_a_failed_verification_deletes_nothing(tmp_path: Path) -> None:
    old = populate()
    dest = tmp_path / "arch"

    def lose_a_file(stage: str) -> None:
        if stage == "staged":
            next((dest / "_delayq").rglob("*.parquet")).unlink()

    with pytest.raises(archive_job.ArchiveError, match="does not match"):
        archive(dest, lose_a_file)
    assert table_ids() >= set(old)
    assert not list(dest.rglob("*.parquet"))


@pytest.mark.parametrize("stage", archive_job.STAGES)
def test_archive_interrupted_at_any_stage_is_completed_by_the_next_run(
    stage: str, tmp_path: Path, read_archive: Any
) -> None:
    old = populate()
    dest = tmp_path / "arch"

    def crash(at: str) -> None:
        if at == stage:
            raise Crash(at)

    with pytest.raises(Crash):
        archive(dest, crash)
    # Never neither: every row is in the table or in the published archive.
    published = [r["id"] for r in read_archive(dest)] if list(dest.rglob("*.parquet")) else []
    assert set(old) <= table_ids() | set(published)

    summary = archive(dest)
    assert [r["id"] for r in read_archive(dest)] == old  # each exactly once
    assert not table_ids() & set(old)
    assert sorted(Message.objects.values_list("key", flat=True)) == ["pending", "recent"]
    interrupted_with_a_plan = archive_job.STAGES.index(stage) >= archive_job.STAGES.index("planned")
    assert summary.recovered_runs == (1 if interrupted_with_a_plan else 0)
    assert summary.archived == (0 if interrupted_with_a_plan else 12)


def test_archive_killed_midway_and_rerun(
    tmp_path: Path, pipeline_env: dict[str, str], read_archive: Any
) -> None:
    """A real SIGKILL while publishing; the re-run loses nothing and duplicates nothing."""
    old = populate()
    dest = tmp_path / "arch"
    marker = tmp_path / "publishing"
    script = textwrap.dedent(
        f"""
        import time, django
        django.setup()
        from django_delayq.contrib.spark import archive_job, session

        def stop_here(stage):
            if stage == "publishing":  # the first file is published, the rest are not
                open({str(marker)!r}, "w").close()
                time.sleep(600)  # until the test kills this process

        archive_job.run_archive(
            session.get_session("local[1]"),
            archive_job.ArchiveOptions(dest={str(dest)!r}, older_than=86400),
            on_stage=stop_here,
        )
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=pipeline_env)
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, timeout=120, message="stage")
        assert proc.poll() is None, "the archive subprocess exited early"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert set(old) <= table_ids()  # nothing was deleted before the kill

    summary, output = run_pipeline("archive", "--dest", str(dest), "--older-than", "86400")
    assert "completed 1 interrupted run(s) first" in output
    assert summary.recovered_runs == 1 and summary.recovered_deleted == 12
    assert [r["id"] for r in read_archive(dest)] == old
    assert not table_ids() & set(old)


def test_one_archive_run_per_database(tmp_path: Path) -> None:
    populate()
    holder: Any
    if connection.vendor == "postgresql":
        import psycopg

        holder = psycopg.connect(**database.target("default").params, autocommit=True)
        holder.execute("SELECT pg_advisory_lock(hashtext(%s))", [database.ARCHIVE_LOCK])
    elif connection.vendor == "mysql":
        holder = dbapi.connect(database.target("default"))
        holder.cursor().execute("SELECT GET_LOCK(%s, 0)", [database.lock_name("default")])
    else:
        import fcntl

        holder = open(f"{connection.settings_dict['NAME']}.delayq-archive.lock", "a")  # noqa: SIM115
        fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with pytest.raises(PipelineError, match="another delayq_pipeline archive is running"):
            archive(tmp_path / "arch")
    finally:
        holder.close()
    assert archive(tmp_path / "arch").deleted == 12


def test_dry_run_reports_what_would_move_and_changes_nothing(tmp_path: Path) -> None:
    populate()
    before = table_ids()
    dest = tmp_path / "arch"
    summary, output = run_pipeline(
        "archive", "--dest", str(dest), "--older-than", "86400", "--dry-run", "--queue", "mail"
    )
    assert summary.archived == 6 and set(summary.by_queue) == {"mail"}
    assert "dry run: would archive 6 message(s)" in output
    assert "  mail: 6 (finished" in output
    assert table_ids() == before
    assert not dest.exists()


def test_a_second_run_cannot_start_while_the_first_holds_the_lock(tmp_path: Path) -> None:
    """Even from the same process (on PostgreSQL the same Django connection)."""
    old = populate()
    dest = tmp_path / "arch"
    tried: list[str] = []

    def second_run(stage: str) -> None:
        if stage == "published":  # the first run is about to delete
            tried.append(stage)
            with pytest.raises(PipelineError, match="another delayq_pipeline archive is running"):
                archive(dest)

    summary = archive(dest, second_run)
    assert tried == ["published"]
    assert (summary.archived, summary.deleted, summary.recovered_runs) == (12, 12, 0)
    assert not table_ids() & set(old)


@pytest.mark.skipif(
    "connection.vendor != 'mysql'",
    reason="the delete that reads and locks versions first is MariaDB/MySQL's "
    "(PostgreSQL's is one statement on an id array; SQLite has one writer at a time)",
)
def test_the_delete_waits_only_for_the_rows_it_deletes() -> None:
    """Delete tasks run side by side: a row another transaction holds elsewhere in the
    table must not make a batch wait (as a scan of the whole table would)."""
    old = populate()
    target = database.target("default")
    impatient = replace(target, init_sql=(*target.init_sql, "SET innodb_lock_wait_timeout = 1"))
    plan = replace(database.delete_plan("default"), target=impatient)
    message = Message.objects.get(pk=old[1])
    version = (
        message.pk,
        message.status,
        message.attempt_count,
        (message.updated_at - dbapi.EPOCH) // dbapi.MICROSECOND,
        (message.finished_at - dbapi.EPOCH) // dbapi.MICROSECOND,
    )
    holder = dbapi.connect(target)
    try:
        holder.cursor().execute(
            "SELECT id FROM django_delayq_message WHERE id = %s FOR UPDATE", [old[0]]
        )
        assert next(dbapi.delete_partition(plan, [version])) == (1, 0)
    finally:
        holder.rollback()
        holder.close()
    assert table_ids() & set(old) == set(old) - {old[1]}


def test_the_named_lock_carries_its_database_within_64_characters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MariaDB/MySQL's named locks belong to the server, and their names have at most
    64 characters: each database gets its own name, a long one hashed."""
    monkeypatch.setitem(connection.settings_dict, "NAME", "shop")
    assert database.lock_name("default") == "django_delayq.archive:shop"
    names = set()
    for last in "ab":
        monkeypatch.setitem(connection.settings_dict, "NAME", "x" * 63 + last)
        name = database.lock_name("default")
        assert len(name) == 64 and name.startswith("django_delayq.archive:")
        names.add(name)
    assert len(names) == 2


def lose_the_lock() -> None:
    """What a server or an operator can do to a run: the lock goes away under it."""
    if connection.vendor == "postgresql":
        import psycopg

        with psycopg.connect(**database.target("default").params, autocommit=True) as admin:
            pids = [
                pid
                for (pid,) in admin.execute(
                    # Advisory locks belong to a database: another suite's run
                    # on the same server holds its own.
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND objid = (hashtext(%s)::bigint & 4294967295)::oid "
                    "AND database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())",
                    [database.ARCHIVE_LOCK],
                )
            ]
            assert len(pids) == 1, pids
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", [pids[0]])
    elif connection.vendor == "mysql":
        # Named locks belong to the server; the name carries this database's.
        admin = dbapi.connect(database.target("default"))
        try:
            cursor = admin.cursor()
            cursor.execute("SELECT IS_USED_LOCK(%s)", [database.lock_name("default")])
            (holder,) = cursor.fetchone()
            assert holder is not None
            cursor.execute(f"KILL {int(holder)}")
        finally:
            admin.close()
    else:  # the lock file removed: a second run would lock a new one
        os.unlink(f"{connection.settings_dict['NAME']}.delayq-archive.lock")


@pytest.mark.parametrize("stage", ["verified", "planned", "published"])
def test_a_lost_lock_stops_the_run_before_it_deletes(
    stage: str, tmp_path: Path, read_archive: Any
) -> None:
    old = populate()
    dest = tmp_path / "arch"

    def lose(at: str) -> None:
        if at == stage:
            lose_the_lock()

    with pytest.raises(PipelineError, match="lost its lock") as caught:
        archive(dest, lose)
    assert "nothing more was deleted" in str(caught.value)
    assert table_ids() >= set(old)

    summary = archive(dest)  # the next run completes (or redoes) the stopped one
    assert [r["id"] for r in read_archive(dest)] == old
    assert not table_ids() & set(old)
    assert summary.recovered_runs == (0 if stage == "verified" else 1)


def test_the_archive_leaves_a_parent_whose_children_still_wait() -> None:
    """Its selection (the JDBC query's WHERE, and the dry run's) keeps a workflow's
    parent while a child that reads its result may still run, as pruning does."""
    from django_delayq import enqueue

    old = timezone.now() - timedelta(days=3)
    parent = finished("mail", "parent", finished_at=old)
    done_parent = finished("mail", "done-parent", finished_at=old)
    lone = finished("mail", "lone", finished_at=old)
    failed_parent = finished("mail", "failed-parent", finished_at=old)
    enqueue("mail", {}, key="child", after=[parent], on_parent_failure="wait", delay=3600)
    child = enqueue("mail", {}, key="done-child", after=[done_parent]).message
    Message.objects.filter(pk=child.pk).update(status="succeeded", finished_at=old)
    # A failed child may run again (an operator's retry): its parent stays too.
    failed = enqueue("mail", {}, key="failed-child", after=[failed_parent]).message
    Message.objects.filter(pk=failed.pk).update(status="failed", finished_at=timezone.now())
    options = archive_job.validate_options(
        archive_job.ArchiveOptions(dest="/tmp/unused", older_than=86400, queues=("mail",))
    )
    cutoff = archive_job.cutoff_for(options)
    where = archive_job._where_sql(options, cutoff)
    table = connection.ops.quote_name(Message._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} WHERE {where}")
        selected = {row[0] for row in cursor.fetchall()}
    assert parent.pk not in selected
    assert failed_parent.pk not in selected
    assert {done_parent.pk, lone.pk, child.pk} <= selected
    dry = set(archive_job._selection(options, cutoff).values_list("pk", flat=True))
    assert dry == selected
