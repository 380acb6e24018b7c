"""The claim's ordered-group condition as a server-side function, on PostgreSQL.

``delayq_group_clear`` holds the two probes that the claim ran as subqueries
(see ``store.groups.group_clear``): the server keeps a function's plan per
connection, while the subqueries were planned again with every claim. Other
databases keep the subqueries; there this migration does nothing.
"""

from django.db import migrations


def create(apps, schema_editor):
    from django_delayq.store.groups import install_group_function

    install_group_function(schema_editor.connection)


def drop(apps, schema_editor):
    from django_delayq.store.groups import install_group_function

    install_group_function(schema_editor.connection, remove=True)


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayq", "0009_flow_control"),
    ]

    operations = [
        # On the database that holds the message table (routers, DELAYQ["DATABASE"]).
        migrations.RunPython(create, drop, hints={"model_name": "message"}),
    ]
