"""Migration 0016: the finished index gains the queue, the failing index is added,
on every database, forwards, backwards and after an interrupted run."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from django_delayq.models import Message

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = Message._meta.db_table


def indexes() -> dict[str, list[str]]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, TABLE)
    return {name: info["columns"] for name, info in found.items() if info["index"]}


def partial_indexes_supported() -> bool:
    return connection.features.supports_partial_indexes


def test_0016_adds_the_queue_to_the_finished_index_and_the_failing_index_and_reverses() -> None:
    # MySQL/MariaDB build no partial index: Django builds them over the whole
    # table, and the failing index (every claim would write it) is left out.
    partial = partial_indexes_supported()
    assert indexes()["delayq_finished_idx"] == ["status", "finished_at", "queue"]
    assert ("delayq_failing_idx" in indexes()) == partial
    try:
        call_command("migrate", "django_delayq", "0015", verbosity=0)
        assert indexes()["delayq_finished_idx"] == ["status", "finished_at"]
        assert "delayq_failing_idx" not in indexes()
    finally:
        call_command("migrate", "django_delayq", verbosity=0)
    assert indexes()["delayq_finished_idx"] == ["status", "finished_at", "queue"]
    if partial:
        assert indexes()["delayq_failing_idx"][:2] == ["last_attempt_time", "error_fingerprint"]


def test_0016_finishes_a_run_interrupted_between_its_steps_on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the concurrent build's steps: PostgreSQL's")
    try:
        call_command("migrate", "django_delayq", "0015", verbosity=0)
        # The new index built under its temporary name, the old one dropped,
        # then the migrate was cancelled before the rename.
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE INDEX delayq_finished_new_idx ON {TABLE} (status, finished_at, queue) "
                "WHERE status IN ('succeeded', 'failed', 'cancelled')"
            )
            cursor.execute("DROP INDEX delayq_finished_idx")
    finally:
        call_command("migrate", "django_delayq", verbosity=0)
    found = indexes()
    assert found["delayq_finished_idx"] == ["status", "finished_at", "queue"]
    assert "delayq_finished_new_idx" not in found
    # Run again by hand over a finished installation: nothing changes.
    from importlib import import_module

    from django.apps import apps
    from django.db import connection as conn

    step = import_module("django_delayq.migrations.0016_covering_history_indexes")
    with conn.schema_editor(atomic=False) as editor:
        step.forwards(apps, editor)
    assert indexes() == found
