"""A workflow in the admin: the change page's parents, children and result, and the
workflow page's graph, blocked steps and buttons (``admin/workflows.py``)."""

import re

import pytest
from django.urls import reverse

from django_delayq import enqueue
from django_delayq.models import Message
from django_delayq.testing import run_pending
from tests.admin.message_pages import change_url
from tests.admin.staff import staff_client

pytestmark = pytest.mark.django_db


def workflow_url(pk):
    return reverse("admin:django_delayq_message_workflow", args=[pk])


@pytest.fixture
def order():
    """charge and reserve, then ship after both; charge fails, so ship is cancelled."""
    charge = enqueue("steps", {"fail": 5}, key="charge")
    reserve = enqueue("steps", {"returns": {"reserved": 3}}, key="reserve")
    ship = enqueue("steps", {}, key="ship", after=[charge, reserve])
    email = enqueue("steps", {}, key="email", after=[ship], on_parent_failure="wait")
    return {"charge": charge, "reserve": reserve, "ship": ship, "email": email}


def test_the_change_page_shows_a_steps_parents_children_and_result(admin_client, order):
    run_pending("steps")
    reserve = Message.objects.get(key="reserve")
    html = admin_client.get(change_url(reserve.pk)).content.decode()
    assert "Workflow" in html and "&quot;reserved&quot;: 3" in html  # its result
    assert f"#{order['ship'].message.pk} steps/ship" in html  # its child
    ship = admin_client.get(change_url(order["ship"].message.pk)).content.decode()
    assert f"#{order['charge'].message.pk} steps/charge" in ship  # its parents
    assert "on_parent_failure=cancel" in ship
    assert workflow_url(order["ship"].message.pk) in ship


def test_a_message_outside_workflows_has_no_workflow_section(admin_client):
    plain = enqueue("default", {}).message
    assert "Workflow" not in admin_client.get(change_url(plain.pk)).content.decode()


def test_a_waiting_step_says_so_in_the_timeline(admin_client, order):
    html = admin_client.get(change_url(order["ship"].message.pk)).content.decode()
    assert "waiting for its parents" in html


def test_the_workflow_page_draws_every_step_coloured_by_status(admin_client, order):
    run_pending("steps")
    response = admin_client.get(workflow_url(order["reserve"].message.pk))
    assert response.status_code == 200
    html = response.content.decode()
    svg = re.search(r'<svg[^>]*class="dq-workflow".*?</svg>', html, re.S).group(0)
    nodes = dict(re.findall(r'data-id="(\d+)" data-status="(\w+)"', svg))
    assert nodes == {
        str(order["charge"].message.pk): "failed",
        str(order["reserve"].message.pk): "succeeded",
        str(order["ship"].message.pk): "cancelled",
        str(order["email"].message.pk): "pending",
    }
    assert svg.count('<path class="dq-edge') == 3
    for result in order.values():
        assert change_url(result.message.pk) in svg  # each box links to its page
    # The email waits (on_parent_failure="wait"); charge failed, ship was cancelled.
    blocked = re.search(r'<ul id="delayq-blocked">(.*?)</ul>', html, re.S).group(1)
    assert "steps/email" in blocked and "steps/ship" not in blocked
    failed = re.search(r'<ul id="delayq-failed">(.*?)</ul>', html, re.S).group(1)
    assert "steps/charge" in failed and "steps/ship" in failed


def test_retrying_from_the_workflow_page_reopens_what_the_failure_cancelled(admin_client, order):
    run_pending("steps")
    Message.objects.filter(key="charge").update(payload={})
    response = admin_client.post(workflow_url(order["ship"].message.pk), {"operation": "retry"})
    assert response.status_code == 302
    assert Message.objects.get(key="ship").status == "pending"
    run_pending("steps")
    statuses = dict(Message.objects.values_list("key", "status"))
    assert statuses == {key: "succeeded" for key in ("charge", "reserve", "ship", "email")}


def test_cancelling_the_waiting_steps(admin_client, order):
    admin_client.post(workflow_url(order["email"].message.pk), {"operation": "cancel"})
    assert set(Message.objects.values_list("status", flat=True)) == {"cancelled"}


def test_a_viewer_sees_the_page_but_cannot_press_its_buttons(order):
    viewer, _ = staff_client("viewer", "view_message")
    response = viewer.get(workflow_url(order["ship"].message.pk))
    assert response.status_code == 200
    assert 'value="cancel"' not in response.content.decode()
    assert (
        viewer.post(workflow_url(order["ship"].message.pk), {"operation": "cancel"}).status_code
        == 403
    )
    assert Message.objects.get(key="ship").status == "pending"
    nobody, _ = staff_client("nobody")
    assert nobody.get(workflow_url(order["ship"].message.pk)).status_code == 403


def test_an_unknown_message_is_404(admin_client):
    assert admin_client.get(workflow_url(999_999)).status_code == 404


def test_deleting_a_parent_from_its_change_page_lets_its_children_go(admin_client):
    """The change page's Delete deleted the row alone (Django's ``obj.delete()``):
    its edges stayed, and its children waited for a parent that was gone, for good.
    It goes the way of the list's delete action."""
    from django_delayq.models import Dependency

    parent = enqueue("steps", {}).message
    child = enqueue("steps", {}, after=[parent]).message
    delete_url = reverse("admin:django_delayq_message_delete", args=[parent.pk])
    response = admin_client.post(delete_url, {"post": "yes"})
    assert response.status_code == 302
    assert not Message.objects.filter(pk=parent.pk).exists()
    assert not Dependency.objects.filter(child_id=child.pk).exists()
    child.refresh_from_db()
    assert child.next_attempt_time is not None  # no parent left to wait for
    run_pending("steps")
    assert Message.objects.get(pk=child.pk).status == "succeeded"


def test_a_message_claimed_after_its_delete_page_was_drawn_is_not_deleted(admin_client):
    from datetime import timedelta

    from django_delayq.store import claim

    message = enqueue("steps", {}).message
    delete_url = reverse("admin:django_delayq_message_delete", args=[message.pk])
    assert admin_client.get(delete_url).status_code == 200
    claim.claim(["steps"], 1, worker="w", lease=timedelta(minutes=5))
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert Message.objects.filter(pk=message.pk, status="running").exists()


def test_a_message_claimed_as_its_delete_is_confirmed_is_left_alone_and_said_so(
    admin_client, monkeypatch
):
    """A worker claims it between the page's permission check and the delete: the
    DELETE spares it, and the operator is told why instead of "deleted"."""
    from datetime import timedelta

    from django_delayq import operations
    from django_delayq.store import claim

    message = enqueue("steps", {}).message
    claim.claim(["steps"], 1, worker="w", lease=timedelta(minutes=5))
    monkeypatch.setattr(operations, "holds_lease", lambda message, now=None: False)
    delete_url = reverse("admin:django_delayq_message_delete", args=[message.pk])
    response = admin_client.post(delete_url, {"post": "yes"}, follow=True)
    assert Message.objects.filter(pk=message.pk, status="running").exists()
    html = response.content.decode()
    assert "was not deleted: running" in html and "deleted successfully" not in html


def test_a_rows_stand_in_links_to_the_row_and_its_status_follows_the_rows(admin_client):
    from tests.testapp.models import Shipment

    shipment = Shipment.objects.create(reference="parcel 7")
    shipment.schedule()
    child = enqueue("steps", {}, after=[shipment])
    stand_in = child.message.parents()[0]
    html = admin_client.get(change_url(stand_in.pk)).content.decode()
    row_url = reverse("admin:testapp_shipment_change", args=[shipment.pk])
    assert "Stands for" in html and f'href="{row_url}"' in html and "parcel 7" in html
    # A message that stands for no row has no such line.
    assert "Stands for" not in admin_client.get(change_url(child.message.pk)).content.decode()
    run_pending(["shipments", "steps"])
    assert Message.objects.get(pk=stand_in.pk).status == "succeeded"
    Shipment.objects.filter(pk=shipment.pk).delete()
    assert "(deleted)" in admin_client.get(change_url(stand_in.pk)).content.decode()
