"""Which run of a worker holds its name: two live workers may not share one.

A worker hands back the messages running under its name that it does not
hold (an earlier run's, killed). A second live worker under the same name
(``--name`` given twice, containers with one host name and the same pid)
would hand back the first one's running messages, and each would run them
again beside the other. ``instance`` tells the runs apart: a worker refuses
a name whose holder still lives (``liveness.register``).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayq", "0013_waited"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerstate",
            name="instance",
            field=models.UUIDField(
                blank=True,
                editable=False,
                help_text="Which run of the worker holds the name.",
                null=True,
            ),
        ),
    ]
