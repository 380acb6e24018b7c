import time

from django.db import connection

from benchmarks.systems import probe
from django_delayq import handler


@handler("noop")
def noop(message):
    """Does nothing: measures the queue's own cost."""
    probe.tick(message.payload.get("i"))


@handler("sleep")
def sleep(message):
    """A job of 1 ms (waiting on something, as most jobs do)."""
    probe.tick(message.payload.get("i"))
    time.sleep(0.001)


@handler("write", atomic=True)
def write(message):
    """Writes one row, committed with the acknowledgement."""
    probe.tick(message.payload.get("i"))
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO bench_sink (n) VALUES (%s)", [message.pk])
