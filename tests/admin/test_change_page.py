"""One message's page: payload, error, timeline, worker, buttons, what may be edited."""

import html
import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_delayq import enqueue
from django_delayq.models import Message
from tests.admin.message_pages import change_url, notes, one_of_each, operation_url
from tests.admin.staff import staff_client
from tests.factories import MessageFactory
from tests.json_values import JSON_VALUES, exact

pytestmark = pytest.mark.django_db


@pytest.fixture
def states(fake_clock):
    return one_of_each(fake_clock())


def page(client, message) -> str:
    response = client.get(change_url(message.pk))
    assert response.status_code == 200
    return response.content.decode()


def form_data(message, **changes):
    data = {
        "kind": message.kind,
        "priority": str(message.priority),
        "max_attempts": "" if message.max_attempts is None else str(message.max_attempts),
        "payload": json.dumps(message.payload),
    }
    data.update(changes)
    return data


def test_payload_is_pretty_printed(admin_client):
    message = MessageFactory(payload={"customer": {"id": 7, "name": "Zoë"}})
    html = page(admin_client, message)
    assert "{\n  &quot;customer&quot;: {\n    &quot;id&quot;: 7," in html
    assert "Zoë" in html


@pytest.mark.parametrize("value", JSON_VALUES)
def test_every_json_payload_is_shown_exactly(admin_client, value):
    message = enqueue("default", value).message
    response = admin_client.get(change_url(message.pk))
    text = response.context["adminform"].form["payload"].value()
    assert exact(json.loads(text)) == exact(value)
    assert html.escape(text) in response.content.decode()
    viewer = staff_client("viewer", "view_message")[0]
    shown = re.search(r'<pre class="dq-pre">(.*?)</pre>', page(viewer, message), re.S)
    assert shown is not None
    assert exact(json.loads(html.unescape(shown.group(1)))) == exact(value)


@pytest.mark.parametrize("value", JSON_VALUES)
def test_every_json_payload_is_saved_exactly(admin_client, value):
    message = enqueue("default", {"before": 1}).message
    response = admin_client.post(
        change_url(message.pk), form_data(message, payload=json.dumps(value))
    )
    assert response.status_code == 302
    assert exact(Message.objects.get(pk=message.pk).payload) == exact(value)


def test_full_error_and_traceback(admin_client, states):
    html = page(admin_client, states["failed"])
    assert '<pre class="dq-pre dq-error">app.Boom: card declined\nsecond line</pre>' in html
    assert "Traceback (most recent call last):\n  File &quot;x.py&quot;" in html


def test_timeline_and_redelivery(admin_client, states, fake_clock):
    html = page(admin_client, states["pending_later"])
    for label in ("Created at", "First scheduled", "Next attempt", "Last attempt", "Finished"):
        assert label in html
    assert "(in 5 min)" in html
    redelivered = MessageFactory(attempt_count=2)
    assert 'alt="True"' in page(admin_client, redelivered).split("field-redelivery")[1][:400]


def test_lock_owner_and_lease_while_running(admin_client, states):
    running = states["running"]
    html = page(admin_client, running)
    assert "web-1:4242" in html
    assert str(running.lock_token) in html
    assert "lease ends in 40 s" in html
    assert "Running on web-1:4242" in html
    assert "not running" in page(admin_client, states["pending_due"])


@pytest.mark.parametrize(
    ("state", "buttons"),
    [
        ("pending_later", {"run_now", "cancel", "reschedule", "reprioritise"}),
        ("pending_due", {"cancel", "reschedule", "reprioritise"}),
        ("running", {"reprioritise"}),
        ("failed", {"retry_failed"}),
        ("succeeded", set()),
    ],
)
def test_buttons_match_the_state(admin_client, states, state, buttons):
    html = page(admin_client, states[state])
    shown = {
        name
        for name in ("run_now", "retry_failed", "cancel", "reschedule", "reprioritise", "delete")
        if operation_url(states[state].pk, name) in html
    }
    assert shown == buttons


def test_queue_columns_are_read_only(admin_client, states):
    message = states["pending_due"]
    data = form_data(
        message,
        status="succeeded",
        attempt_count="9",
        queue="other",
        key="other",
        lock_token="00000000-0000-0000-0000-000000000000",
        next_attempt_time="2030-01-01 00:00:00",
    )
    response = admin_client.post(change_url(message.pk), data)
    assert response.status_code == 302
    after = Message.objects.get(pk=message.pk)
    assert (after.status, after.attempt_count, after.queue, after.key) == (
        "pending",
        0,
        "emails",
        "pending-due",
    )
    assert after.next_attempt_time == message.next_attempt_time
    assert after.lock_token is None


def test_editing_writes_only_the_edited_columns(admin_client, states, fake_clock):
    message = states["running"]
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.post(
            change_url(message.pk),
            form_data(message, priority="4", payload='{"fixed": true}'),
        )
    assert response.status_code == 302
    update = next(q["sql"] for q in ctx.captured_queries if q["sql"].startswith("UPDATE"))
    qn = connection.ops.quote_name
    assert qn("priority") in update and qn("payload") in update and qn("updated_at") in update
    assert qn("status") not in update and qn("lock_token") not in update
    after = Message.objects.get(pk=message.pk)
    assert after.priority == 4 and after.payload == {"fixed": True}
    assert after.status == "running" and after.lock_token == message.lock_token
    assert after.updated_at == fake_clock()


@pytest.mark.parametrize(
    ("payload", "error"),
    [("{not json", "Enter a valid JSON."), ('{"a": "x\\u0000y"}', "NUL character")],
)
def test_payload_edits_are_validated(admin_client, states, payload, error):
    message = states["pending_due"]
    response = admin_client.post(change_url(message.pk), form_data(message, payload=payload))
    assert response.status_code == 200
    assert error in response.content.decode()
    assert Message.objects.get(pk=message.pk).payload == {}


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"max_attempts": "1000001"}, "less than or equal to 1000000"),
        ({"max_attempts": "99999999999999999999"}, "less than or equal to 1000000"),
        ({"max_attempts": "0"}, "greater than or equal to 1"),
        ({"priority": "40000"}, "less than or equal to 32767"),
        ({"priority": "99999999999999999999"}, "less than or equal to 32767"),
    ],
)
def test_number_edits_out_of_range_are_form_errors(admin_client, states, changes, error):
    message = states["pending_due"]
    response = admin_client.post(change_url(message.pk), form_data(message, **changes))
    assert response.status_code == 200
    assert error in response.content.decode()
    after = Message.objects.get(pk=message.pk)
    assert (after.max_attempts, after.priority) == (message.max_attempts, message.priority)


# -- the kind of a running message: its handler and its limits ----------------------


def test_the_kind_of_a_running_message_is_read_only_and_the_page_says_so(admin_client, states):
    running = page(admin_client, states["running"])
    assert 'name="kind"' not in running
    assert "The kind is read-only while the message runs" in running
    pending = page(admin_client, states["pending_due"])
    assert 'name="kind"' in pending
    assert "read-only while the message runs" not in pending


def test_a_kind_sent_for_a_message_running_by_now_is_not_written(admin_client, states):
    """The page was loaded while the message waited; it runs by the time of the save."""
    message = states["running"]
    response = admin_client.post(
        change_url(message.pk), form_data(message, kind="other", priority="3")
    )
    assert response.status_code == 302
    after = Message.objects.get(pk=message.pk)
    assert (after.kind, after.priority) == (message.kind, 3)
    assert any("The kind was not changed" in n for n in notes(response))


def test_a_claim_while_the_form_is_saved_refuses_the_kind_edit_whole(
    admin_client, states, monkeypatch
):
    from django_delayq.admin.messages import MessageAdmin
    from django_delayq.store import claim

    message = states["pending_due"]
    original = MessageAdmin.save_form

    def claimed_meanwhile(self, request, form, change):
        # After the request read the message (pending) and validated the form.
        claim.claim(["emails"], 1, worker="w", lease=timedelta(seconds=30))
        return original(self, request, form, change)

    monkeypatch.setattr(MessageAdmin, "save_form", claimed_meanwhile)
    response = admin_client.post(
        change_url(message.pk), form_data(message, kind="other", priority="3")
    )
    assert response.status_code == 302 and response.url == change_url(message.pk)
    after = Message.objects.get(pk=message.pk)
    assert (after.status, after.kind, after.priority) == ("running", message.kind, message.priority)
    said = notes(response)
    assert any(n.startswith("Nothing was saved") for n in said)
    assert not any("changed successfully" in n for n in said)


def test_editing_the_kind_of_a_running_message_cannot_exceed_its_kinds_global_cap(
    admin_client, fake_clock
):
    """A kind's cap counts the running messages of that kind: a running message moved to
    another kind left a place free while its handler still ran, and the next claim took
    it: two handlers of a kind capped at one."""
    from django_delayq.flow import Scope
    from django_delayq.store.limits import claim_limited

    for key in ("first", "second"):
        enqueue("orders", {}, key=key, kind="export")
    cap = Scope("orders", "export", cap=1)

    def claim():
        return claim_limited(
            ["orders"], 5, [cap], worker="w", lease=timedelta(seconds=30), kinds=(["export"], True)
        ).claim.messages

    (running,) = claim()
    response = admin_client.post(change_url(running.pk), form_data(running, kind="report"))
    assert response.status_code == 302
    assert Message.objects.get(pk=running.pk).kind == "export"
    assert claim() == []  # the cap is full while the first one runs
