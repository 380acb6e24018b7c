"""Who may see and do what in the message admin; login and CSRF."""

import re

import pytest
from django.test import Client

from django_delayq.models import Message
from tests.admin.message_pages import (
    CHANGELIST,
    action_data,
    change_url,
    confirm_data,
    one_of_each,
    operation_url,
)
from tests.admin.staff import staff_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def states(fake_clock):
    return one_of_each(fake_clock())


def action_names(response) -> set[str]:
    return set(re.findall(r'<option value="(\w+)">', response.content.decode()))


def test_anonymous_users_are_sent_to_the_login(states):
    client = Client()
    pk = states["pending_due"].pk
    for response in (
        client.get(CHANGELIST),
        client.get(change_url(pk)),
        client.post(operation_url(pk, "cancel"), {"post": "yes"}),
        client.post(CHANGELIST, confirm_data("cancel", [pk])),
    ):
        assert response.status_code == 302 and "/login/" in response["Location"]
    assert Message.objects.get(pk=pk).status == "pending"


def test_staff_without_permissions_see_nothing(states):
    client, _ = staff_client("nobody")
    assert client.get(CHANGELIST).status_code == 403
    assert client.get(change_url(states["failed"].pk)).status_code == 403


def test_view_permission_lists_and_shows_but_offers_no_actions(states):
    client, _ = staff_client("viewer", "view_message")
    response = client.get(CHANGELIST)
    assert response.status_code == 200
    assert 'name="action"' not in response.content.decode()
    page = client.get(change_url(states["failed"].pk))
    assert page.status_code == 200
    html = page.content.decode()
    assert "dq-op-button" not in html
    assert "/delete/" not in html
    assert '<pre class="dq-pre">' in html  # the payload, read-only


def test_view_permission_cannot_post_actions_or_operations(states):
    client, _ = staff_client("viewer", "view_message")
    pk = states["pending_due"].pk
    assert client.post(CHANGELIST, action_data("cancel", [pk])).status_code == 403
    assert client.post(CHANGELIST, confirm_data("cancel", [pk])).status_code == 403
    assert client.post(CHANGELIST, confirm_data("delete", [pk])).status_code == 403
    assert client.post(operation_url(pk, "cancel"), {"post": "yes"}).status_code == 403
    assert client.post(change_url(pk), {"priority": "5"}).status_code == 403
    message = Message.objects.get(pk=pk)
    assert message.status == "pending" and message.priority == 0


def test_change_permission_runs_change_actions_but_not_delete(states):
    client, _ = staff_client("operator", "view_message", "change_message")
    response = client.get(CHANGELIST)
    assert action_names(response) == {
        "run_now",
        "retry_failed",
        "cancel",
        "reschedule",
        "reprioritise",
    }
    pk = states["pending_due"].pk
    assert client.post(CHANGELIST, confirm_data("cancel", [pk])).status_code == 302
    assert Message.objects.get(pk=pk).status == "cancelled"
    other = states["succeeded"].pk
    assert client.post(CHANGELIST, confirm_data("delete", [other])).status_code == 403
    assert client.post(operation_url(other, "delete"), {"post": "yes"}).status_code == 403
    assert client.get(f"{change_url(other)[: -len('change/')]}delete/").status_code == 403
    assert Message.objects.filter(pk=other).exists()


def test_delete_permission_deletes_but_cannot_change(states):
    client, _ = staff_client("cleaner", "view_message", "delete_message")
    assert action_names(client.get(CHANGELIST)) == {"delete"}
    pk = states["pending_due"].pk
    assert client.post(CHANGELIST, confirm_data("cancel", [pk])).status_code == 403
    response = client.post(CHANGELIST, confirm_data("delete", [pk]))
    assert response.status_code == 302
    assert not Message.objects.filter(pk=pk).exists()


def test_nobody_may_add_messages_in_the_admin(admin_client):
    assert admin_client.get(f"{CHANGELIST}add/").status_code == 403
    assert f'href="{CHANGELIST}add/"' not in admin_client.get(CHANGELIST).content.decode()


def test_a_running_message_cannot_be_deleted_from_its_page(admin_client, states):
    pk = states["running"].pk
    assert "deletelink" not in admin_client.get(change_url(pk)).content.decode()
    delete_url = f"{change_url(pk)[: -len('change/')]}delete/"
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert Message.objects.filter(pk=pk).exists()
    assert admin_client.get(change_url(states["failed"].pk)).content.decode().count("deletelink")


def test_csrf_is_enforced(admin_user, states):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    pk = states["pending_due"].pk
    assert client.post(CHANGELIST, confirm_data("cancel", [pk])).status_code == 403
    assert client.post(operation_url(pk, "cancel"), {"post": "yes"}).status_code == 403
    assert Message.objects.get(pk=pk).status == "pending"
    page = client.get(CHANGELIST)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    response = client.post(
        CHANGELIST, {**confirm_data("cancel", [pk]), "csrfmiddlewaretoken": token.group(1)}
    )
    assert response.status_code == 302
    assert Message.objects.get(pk=pk).status == "cancelled"
