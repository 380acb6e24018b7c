"""Waiting for a message's end: the row says somebody waits, and on PostgreSQL a
trigger announces the end of such a row (``store.ended``).

The column has a database default, so PostgreSQL does not rewrite the table
and a worker of the previous release keeps writing rows without it. The
trigger's condition is the column itself: rows nobody waits for queue no
event.
"""

from django.db import migrations, models


def create(apps, schema_editor):
    from django_delayq.store.ended import install_triggers

    install_triggers(schema_editor.connection)


def drop(apps, schema_editor):
    from django_delayq.store.ended import install_triggers

    install_triggers(schema_editor.connection, remove=True)


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayq", "0012_workflows"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="waited",
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        # On the database that holds the message table (routers, DELAYQ["DATABASE"]).
        migrations.RunPython(create, drop, hints={"model_name": "message"}),
    ]
