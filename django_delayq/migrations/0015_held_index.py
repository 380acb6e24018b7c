"""An index of the held messages per queue: steps waiting for their parents and
ordered-group members waiting for their turn (pending, no due time).

The dashboard, ``delayq_status``, the metrics and the admin's filter count
them; without it each count read the whole table (1 s at 10 million kept
messages). On PostgreSQL it is built without locking the table against
writes (``CONCURRENTLY``, so this migration is not atomic): a table that
large is a live queue's.
"""

from django.db import migrations, models, router

INDEX = models.Index(
    fields=["queue"],
    name="delayq_held_idx",
    condition=models.Q(status="pending", next_attempt_time__isnull=True),
)


def _valid(connection):
    """Whether the index exists and is valid (None: it does not exist)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s AND c.relnamespace = to_regnamespace(current_schema())",
            [INDEX.name],
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def forwards(apps, schema_editor):
    message = apps.get_model("django_delayq", "Message")
    connection = schema_editor.connection
    if not router.allow_migrate_model(connection.alias, message):
        return
    if connection.vendor != "postgresql":
        schema_editor.add_index(message, INDEX)
        return
    valid = _valid(connection)
    if valid:
        return
    if valid is False:
        # A CONCURRENTLY build that failed (a cancelled migrate) leaves an
        # invalid index behind: drop it and build it again.
        schema_editor.remove_index(message, INDEX, concurrently=True)
    schema_editor.add_index(message, INDEX, concurrently=True)


def backwards(apps, schema_editor):
    message = apps.get_model("django_delayq", "Message")
    connection = schema_editor.connection
    if not router.allow_migrate_model(connection.alias, message):
        return
    if connection.vendor == "postgresql":
        schema_editor.remove_index(message, INDEX, concurrently=True)
    else:
        schema_editor.remove_index(message, INDEX)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_delayq", "0014_worker_instance"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
            state_operations=[migrations.AddIndex(model_name="message", index=INDEX)],
        ),
    ]
