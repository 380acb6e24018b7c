from django.db import connection

from benchmarks.systems import probe
from django_delayq import handler


@handler("noop")
def noop(message):
    """Does nothing: measures the queue's own cost."""
    probe.tick(message.payload.get("i"))


@handler("write", atomic=True)
def write(message):
    """Writes one row, committed with the acknowledgement."""
    probe.tick(message.payload.get("i"))
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO bench_sink (n) VALUES (%s)", [message.pk])
