"""django-tasks tasks run by django-tasks-db's ``db_worker``."""

import time

from django.db import transaction
from django_tasks import task

from benchmarks.peerapp.models import Sink
from benchmarks.systems import probe


@task(queue_name="noop")
def noop(i: int) -> None:
    probe.tick(i)


@task(queue_name="sleep")
def sleep(i: int) -> None:
    probe.tick(i)
    time.sleep(0.001)


@task(queue_name="write")
def write(i: int) -> None:
    probe.tick(i)
    with transaction.atomic():
        Sink.objects.create(n=i)
