"""Two indexes for the admin's pages beside a long history, built without downtime.

* ``delayq_finished_idx`` gains the queue: the dashboard's per-queue counts
  of the last hour read it alone instead of a table page per message
  (ten million kept messages: ``benchmarks/history.py``).
* ``delayq_failing_idx``: failed and retrying messages by the time of their
  last attempt, covering the failures page's groups of a recent window,
  which otherwise read every failure retention keeps.

MySQL and MariaDB build no partial index: there Django builds every index
over the whole table, and one over every message's last attempt would be
written at every claim, so they go without the failing index (their
failures page reads ``delayq_fingerprint_idx``, as before).

On PostgreSQL both are built ``CONCURRENTLY`` (so this migration is not
atomic): the new finished index under a temporary name, then the old one
dropped and the new one renamed, so pruning always has one. A build that
failed (a cancelled migrate) leaves an invalid index, dropped and built
again on the next run.
"""

from django.db import migrations, models, router

FINISHED = ["succeeded", "failed", "cancelled"]
OLD_FINISHED = models.Index(
    fields=["status", "finished_at"],
    name="delayq_finished_idx",
    condition=models.Q(status__in=FINISHED),
)
FINISHED_INDEX = models.Index(
    fields=["status", "finished_at", "queue"],
    name="delayq_finished_idx",
    condition=models.Q(status__in=FINISHED),
)
BUILDING = models.Index(
    fields=FINISHED_INDEX.fields,
    name="delayq_finished_new_idx",
    condition=FINISHED_INDEX.condition,
)
FAILING_INDEX = models.Index(
    fields=["last_attempt_time", "error_fingerprint", "queue", "status", "attempt_count", "id"],
    name="delayq_failing_idx",
    condition=~models.Q(error_fingerprint="") & models.Q(status__in=["failed", "pending"]),
)


def _index(connection, name):
    """(valid, number of columns) of the index ``name``, or None if there is none."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid, i.indnatts FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s AND c.relnamespace = to_regnamespace(current_schema())",
            [name],
        )
        return cursor.fetchone()


def _build(schema_editor, model, index):
    """Build ``index`` concurrently unless a valid one is there already."""
    found = _index(schema_editor.connection, index.name)
    if found and found[0]:
        return
    if found:
        schema_editor.remove_index(model, index, concurrently=True)
    schema_editor.add_index(model, index, concurrently=True)


def forwards(apps, schema_editor):
    message = apps.get_model("django_delayq", "Message")
    connection = schema_editor.connection
    if not router.allow_migrate_model(connection.alias, message):
        return
    if connection.vendor != "postgresql":
        schema_editor.remove_index(message, OLD_FINISHED)
        schema_editor.add_index(message, FINISHED_INDEX)
        if connection.features.supports_partial_indexes:
            schema_editor.add_index(message, FAILING_INDEX)
        return
    current = _index(connection, FINISHED_INDEX.name)
    if not (current and current[0] and current[1] == len(FINISHED_INDEX.fields)):
        _build(schema_editor, message, BUILDING)
        if current:
            schema_editor.remove_index(message, OLD_FINISHED, concurrently=True)
        table = schema_editor.quote_name(BUILDING.name)
        schema_editor.execute(
            f"ALTER INDEX {table} RENAME TO {schema_editor.quote_name(FINISHED_INDEX.name)}"
        )
    _build(schema_editor, message, FAILING_INDEX)


def backwards(apps, schema_editor):
    message = apps.get_model("django_delayq", "Message")
    connection = schema_editor.connection
    if not router.allow_migrate_model(connection.alias, message):
        return
    concurrently = {"concurrently": True} if connection.vendor == "postgresql" else {}
    if connection.features.supports_partial_indexes:
        schema_editor.remove_index(message, FAILING_INDEX, **concurrently)
    schema_editor.remove_index(message, FINISHED_INDEX, **concurrently)
    schema_editor.add_index(message, OLD_FINISHED, **concurrently)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_delayq", "0015_held_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
            state_operations=[
                migrations.RemoveIndex(model_name="message", name="delayq_finished_idx"),
                migrations.AddIndex(model_name="message", index=FINISHED_INDEX),
                migrations.AddIndex(model_name="message", index=FAILING_INDEX),
            ],
        ),
    ]
