"""The search indexes, built without locking the table against writes (PostgreSQL)."""

from django.db import migrations, router

from django_delayq.contrib.search_indexes import indexes


def forwards(apps, schema_editor):
    message = apps.get_model("django_delayq", "Message")
    if router.allow_migrate_model(schema_editor.connection.alias, message):
        indexes.create(schema_editor.connection, message)


def backwards(apps, schema_editor):
    message = apps.get_model("django_delayq", "Message")
    if router.allow_migrate_model(schema_editor.connection.alias, message):
        indexes.drop(schema_editor.connection)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [("django_delayq", "0009_flow_control")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
