"""Workflows: a handler's result, and the edges of messages enqueued ``after=`` others.

The new columns of the message table have database defaults, so they cost
PostgreSQL no rewrite of the table, and a worker of the previous release
keeps writing rows without them.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayq", "0011_worker_alive_until"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="has_children",
            field=models.BooleanField(
                db_default=False,
                default=False,
                editable=False,
                help_text="Messages wait for this one (enqueued with after=).",
            ),
        ),
        migrations.AddField(
            model_name="message",
            name="on_parent_failure",
            field=models.CharField(
                blank=True,
                choices=[("cancel", "cancel"), ("wait", "wait"), ("run", "run")],
                db_default="",
                default="",
                editable=False,
                help_text="Empty: no parents. What a parent's failure does: cancel this message, keep it waiting, or run it anyway.",
                max_length=8,
            ),
        ),
        migrations.AddField(
            model_name="message",
            name="parents_failed",
            field=models.PositiveIntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AddField(
            model_name="message",
            name="parents_waiting",
            field=models.PositiveIntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AddField(
            model_name="message",
            name="result",
            field=models.JSONField(
                blank=True,
                editable=False,
                help_text="What the handler returned (JSON), stored when it succeeded.",
                null=True,
            ),
        ),
        migrations.CreateModel(
            name="Dependency",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("position", models.PositiveIntegerField(default=0)),
                ("parent_ended", models.CharField(blank=True, default="", max_length=16)),
                ("cancelled_child", models.BooleanField(default=False)),
                (
                    "child",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="parent_edges",
                        to="django_delayq.message",
                    ),
                ),
                (
                    "parent",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="child_edges",
                        to="django_delayq.message",
                    ),
                ),
            ],
            options={
                "verbose_name": "dependency",
                "verbose_name_plural": "dependencies",
                "indexes": [
                    models.Index(
                        condition=models.Q(("parent_ended", "")),
                        fields=["child"],
                        name="delayq_dependency_open_idx",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("parent", "child"), name="delayq_dependency_edge"
                    )
                ],
            },
        ),
    ]
