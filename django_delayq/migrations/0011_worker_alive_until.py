"""A worker's heartbeat promises how long it lives, and the claim asks it.

A running message whose lease passed is taken by a claim only if its worker
is gone (``store.queries.claimable_condition``): ``alive_until`` is the
moment a worker's heartbeat last promised to beat again by. On PostgreSQL
the test is the server-side function ``delayq_holder_gone``, whose plan is
kept per connection (as a subquery of the claim it doubled the claim's
planning); other databases keep the subquery, and there the function is
not created.
"""

from django.db import migrations, models


def create(apps, schema_editor):
    from django_delayq.store.groups import install_holder_function

    install_holder_function(schema_editor.connection)


def drop(apps, schema_editor):
    from django_delayq.store.groups import install_holder_function

    install_holder_function(schema_editor.connection, remove=True)


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayq", "0010_group_clear_function"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerstate",
            name="alive_until",
            field=models.DateTimeField(
                blank=True, help_text="Moved forward by every heartbeat.", null=True
            ),
        ),
        # On the database that holds the message table (routers, DELAYQ["DATABASE"]).
        migrations.RunPython(create, drop, hints={"model_name": "message"}),
    ]
