"""An outcome whose connection died is sent again after a reconnect, once."""

import pytest
from django.db import OperationalError, connection

from django_delayq import enqueue, handler
from django_delayq.models import Message
from django_delayq.registry import registry

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

runs: list[int] = []


@pytest.fixture
def ack_cut_handler():
    if connection.vendor != "postgresql":
        pytest.skip("pg_terminate_backend is PostgreSQL's")

    @handler("ack-cut")
    def cut_own_connection(message):
        # The handler's work is done; then the connection it shares with the
        # acknowledgement dies, as in a server restart between the two.
        runs.append(message.pk)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        except OperationalError:
            pass

    runs.clear()
    yield
    registry.unregister("ack-cut")


def test_ack_lost_with_its_connection_is_sent_again(ack_cut_handler, run_worker):
    message = enqueue("ack-cut", {}).message
    stats = run_worker(["ack-cut"])
    message.refresh_from_db()
    assert (message.status, message.attempt_count, message.lock_token) == ("succeeded", 1, None)
    assert runs == [message.pk]  # ran once, acknowledged after the reconnect
    # Without the re-send the outcome would be "unrecorded", left to the lease.
    assert stats["succeeded"] == 1 and not stats["unrecorded"]
    assert Message.objects.filter(status="running").count() == 0
