"""delayq_finished_idx covers finished rows only.

Every enqueue and every claim used to add an entry to it for a row that was
not finished, and with running rows under-represented in the statistics the
planner could read it for an acknowledgement (``status = 'running'``) instead
of looking the row up by its primary key. Rebuilding the index takes a lock
that blocks writes to the message table for the length of the build: on a
large table, run it in a quiet moment.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_delayq', '0005_message_storage_parameters'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='message',
            name='delayq_finished_idx',
        ),
        migrations.AddIndex(
            model_name='message',
            index=models.Index(condition=models.Q(('status__in', ['succeeded', 'failed', 'cancelled'])), fields=['status', 'finished_at'], name='delayq_finished_idx'),
        ),
    ]
