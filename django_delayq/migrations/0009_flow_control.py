"""Flow control: ordered groups (``Message.group`` and its index), and the rows
global limits lock and count (``FlowState``, ``FlowStart``).

``FlowStart``'s foreign key is created with its table: added afterwards,
Django would send it together with ``SET CONSTRAINTS`` in one string, which
a server-side-binding connection (prepared statements) refuses.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayq", "0008_superseded_at"),
    ]

    operations = [
        migrations.CreateModel(
            name="FlowState",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("queue", models.CharField(max_length=100)),
                ("kind", models.CharField(blank=True, default="", max_length=100)),
                ("claimed_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "flow state",
                "verbose_name_plural": "flow states",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("queue", "kind"), name="delayq_flowstate_scope"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="FlowStart",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("started_at", models.DateTimeField()),
                (
                    "flow",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="django_delayq.flowstate",
                    ),
                ),
            ],
            options={
                "verbose_name": "flow start",
                "verbose_name_plural": "flow starts",
                "indexes": [
                    models.Index(fields=["flow", "started_at"], name="delayq_flowstart_idx")
                ],
            },
        ),
        migrations.AddField(
            model_name="message",
            name="group",
            field=models.CharField(
                blank=True,
                db_column="message_group",
                db_default="",
                default="",
                help_text=(
                    "Messages of one group in one queue run one at a time, in the order they "
                    "were enqueued; empty: no group."
                ),
                max_length=200,
            ),
        ),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(
                condition=models.Q(
                    models.Q(("group", ""), _negated=True),
                    ("status__in", ["pending", "running", "failed"]),
                ),
                fields=["queue", "group", "status", "id"],
                name="delayq_group_idx",
            ),
        ),
    ]
