"""The read-only workers page of the admin."""

from datetime import timedelta

import pytest
from django.urls import reverse

from django_delayq import enqueue, liveness
from django_delayq.store import claim
from tests.admin.staff import staff_client

pytestmark = pytest.mark.django_db

URL = "admin:django_delayq_workerstate_changelist"


def test_workers_page_shows_state_and_running_messages(fake_clock):
    liveness.register("host-a:11", queues=["default"], concurrency=2)
    liveness.register("host-b:22", queues=["other"], concurrency=1)
    enqueue("default", {})
    claim.claim(["default"], 1, worker="host-a:11", lease=timedelta(hours=1))
    fake_clock.advance(liveness.dead_after().total_seconds() + 1)
    liveness.beat("host-b:22")
    client, _ = staff_client("viewer", "view_workerstate")
    page = client.get(reverse(URL))
    assert page.status_code == 200
    rows = {
        row["name"]: row
        for row in (
            {
                "name": obj.name,
                "state": page.context["cl"].model_admin.state(obj),
                "held": obj.held_count,
            }
            for obj in page.context["cl"].result_list
        )
    }
    assert rows["host-a:11"]["state"] == "dead" and rows["host-a:11"]["held"] == 1
    assert rows["host-b:22"]["state"] == "live" and rows["host-b:22"]["held"] == 0
    assert b"host-a:11" in page.content and b"dead" in page.content


def test_workers_cannot_be_added_or_edited():
    liveness.register("host-a:11", queues=["default"], concurrency=1)
    client, _ = staff_client("boss", "view_workerstate", "add_workerstate", "change_workerstate")
    assert client.get(reverse("admin:django_delayq_workerstate_add")).status_code == 403
    page = client.get(reverse(URL))
    assert b"Add worker" not in page.content
