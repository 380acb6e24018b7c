"""Admin actions: intermediate page, confirmation, "all N matching", reports, buttons."""

from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_delayq.models import Message
from tests.admin.message_pages import (
    CHANGELIST,
    action_data,
    change_url,
    confirm_data,
    notes,
    one_of_each,
    operation_url,
)
from tests.factories import MessageFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def states(fake_clock):
    return one_of_each(fake_clock())


def ids(states, *names):
    return [states[n].pk for n in names]


def test_no_django_delete_selected(admin_client):
    html = admin_client.get(CHANGELIST).content.decode()
    assert 'value="delete_selected"' not in html
    for name in ("run_now", "retry_failed", "cancel", "reschedule", "reprioritise", "delete"):
        assert f'value="{name}"' in html


def test_first_post_shows_what_will_happen_and_changes_nothing(admin_client, states):
    selected = ids(states, "pending_due", "pending_later", "running", "failed")
    response = admin_client.post(CHANGELIST, action_data("cancel", selected))
    assert response.status_code == 200
    assert response.templates[0].name == "admin/django_delayq/message/action_confirmation.html"
    html = response.content.decode()
    assert "4 messages selected" in html
    assert "2 will change." in html
    assert "1 will be skipped: running: a worker holds its lease" in html
    assert "1 will be skipped: failed (use Retry to run it again)" in html
    for pk in selected:
        assert f'name="_selected_action" value="{pk}"' in html
    assert 'name="post" value="yes"' in html and 'name="select_across" value="0"' in html
    assert set(Message.objects.values_list("status", flat=True)) == {
        "pending",
        "running",
        "failed",
        "succeeded",
    }
    assert Message.objects.filter(status="pending").count() == 2


def test_confirming_cancel_reports_changed_and_skipped(admin_client, states):
    selected = ids(states, "pending_due", "pending_later", "running", "failed")
    response = admin_client.post(CHANGELIST, confirm_data("cancel", selected))
    assert response.status_code == 302 and response["Location"] == CHANGELIST
    assert notes(response) == [
        "Cancelled 2 messages. Skipped 2: 1 running: a worker holds its lease (wait until "
        "the attempt ends); 1 failed (use Retry to run it again)."
    ]
    assert Message.objects.get(pk=states["pending_due"].pk).status == "cancelled"
    assert Message.objects.get(pk=states["running"].pk).status == "running"


def test_run_now(admin_client, states, fake_clock):
    response = admin_client.post(
        CHANGELIST, confirm_data("run_now", ids(states, "pending_later", "pending_due"))
    )
    assert notes(response) == ["Made due now 1 message. Skipped 1: 1 already due."]
    assert Message.objects.get(pk=states["pending_later"].pk).next_attempt_time == fake_clock()


def test_retry_with_more_attempts(admin_client, states):
    page = admin_client.post(CHANGELIST, action_data("retry_failed", ids(states, "failed")))
    assert 'name="extra_attempts"' in page.content.decode()
    response = admin_client.post(
        CHANGELIST, confirm_data("retry_failed", ids(states, "failed"), extra_attempts="3")
    )
    assert notes(response) == ["Sent back to pending 1 message."]
    failed = Message.objects.get(pk=states["failed"].pk)
    assert failed.status == "pending" and failed.max_attempts == 8


def test_retry_refuses_a_bad_number_of_attempts(admin_client, states):
    response = admin_client.post(
        CHANGELIST, confirm_data("retry_failed", ids(states, "failed"), extra_attempts="0")
    )
    assert response.status_code == 200
    assert "greater than or equal to 1" in response.content.decode()
    assert Message.objects.get(pk=states["failed"].pk).status == "failed"


def test_reschedule_by_delay(admin_client, states, fake_clock):
    selected = ids(states, "pending_due", "running")
    page = admin_client.post(CHANGELIST, action_data("reschedule", selected))
    html = page.content.decode()
    assert 'type="datetime-local"' in html and 'name="delay"' in html
    response = admin_client.post(CHANGELIST, confirm_data("reschedule", selected, delay="15m"))
    assert notes(response)[0].startswith("Rescheduled 1 message. Skipped 1: 1 running")
    assert Message.objects.get(pk=states["pending_due"].pk).next_attempt_time == (
        fake_clock() + timedelta(minutes=15)
    )


def test_reschedule_at_a_time_in_the_current_time_zone(admin_client, states):
    response = admin_client.post(
        CHANGELIST,
        confirm_data("reschedule", ids(states, "pending_due"), run_at="2031-05-04T10:30:00"),
    )
    assert response.status_code == 302
    expected = timezone.make_aware(timezone.datetime(2031, 5, 4, 10, 30))
    assert Message.objects.get(pk=states["pending_due"].pk).next_attempt_time == expected


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({}, "Give a time to run at or a delay."),
        ({"delay": "5m", "run_at": "2031-05-04T10:30"}, "Give either a time"),
        ({"delay": "soon"}, "not a delay"),
        ({"run_at": "yesterday"}, "Enter a valid date/time."),
        # Past timedelta's range (OverflowError), past MAX_DELAY, past any due time.
        ({"delay": "99999999999d"}, "is over 365000 days"),
        ({"delay": "99999999999999999999999s"}, "is over 365000 days"),
        ({"delay": "400000d"}, "is over 365000 days"),
        ({"delay": "²"}, "not a delay"),
        ({"run_at": "9999-12-31T23:59:59"}, "is out of range"),
        ({"run_at": "0001-01-01T00:00:00"}, "is out of range"),
    ],
)
def test_reschedule_form_errors_are_shown_and_nothing_changes(admin_client, states, data, error):
    before = states["pending_due"].next_attempt_time
    response = admin_client.post(
        CHANGELIST, confirm_data("reschedule", ids(states, "pending_due"), **data)
    )
    assert response.status_code == 200
    assert error in response.content.decode()
    # One error, the one that applies: an invalid delay is not "both" or "neither".
    if len(data) == 1:
        assert "not both" not in response.content.decode()
        assert "Give a time to run at or a delay." not in response.content.decode()
    assert Message.objects.get(pk=states["pending_due"].pk).next_attempt_time == before


def test_reprioritise(admin_client, states):
    response = admin_client.post(
        CHANGELIST,
        confirm_data("reprioritise", ids(states, "pending_due", "succeeded"), priority="9"),
    )
    assert notes(response) == ["Reprioritised 1 message. Skipped 1: 1 already succeeded."]
    assert Message.objects.get(pk=states["pending_due"].pk).priority == 9


def test_reprioritise_out_of_range_is_a_form_error(admin_client, states):
    response = admin_client.post(
        CHANGELIST,
        confirm_data("reprioritise", ids(states, "pending_due"), priority="40000"),
    )
    assert response.status_code == 200
    assert "less than or equal to 32767" in response.content.decode()
    response = admin_client.post(
        CHANGELIST,
        confirm_data("reprioritise", ids(states, "pending_due"), priority="99999999999999999999"),
    )
    assert response.status_code == 200
    assert "less than or equal to 32767" in response.content.decode()


def test_change_page_reschedule_with_a_delay_out_of_range_is_a_form_error(admin_client, states):
    pk = states["pending_due"].pk
    before = states["pending_due"].next_attempt_time
    response = admin_client.post(
        operation_url(pk, "reschedule"), {"post": "yes", "delay": "99999999999d"}
    )
    assert response.status_code == 200
    assert "is over 365000 days" in response.content.decode()
    assert Message.objects.get(pk=pk).next_attempt_time == before


def test_delete_spares_running_messages(admin_client, states):
    selected = ids(states, "pending_due", "running", "succeeded")
    page = admin_client.post(CHANGELIST, action_data("delete", selected))
    assert "2 will change." in page.content.decode()
    assert 'value="Yes, change 2 messages"' in page.content.decode()
    response = admin_client.post(CHANGELIST, confirm_data("delete", selected))
    assert notes(response)[0].startswith("Deleted 2 messages. Skipped 1: 1 running")
    assert set(Message.objects.values_list("key", flat=True)) == {
        "pending-later",
        "running",
        "failed",
    }


def test_select_all_matching_applies_to_the_filtered_set(admin_client, fake_clock):
    pending = MessageFactory.create_batch(5, next_attempt_time=fake_clock())
    failed = MessageFactory(status="failed", next_attempt_time=None)
    url = f"{CHANGELIST}?status__exact=pending"
    # The action bar posts the ids shown on the page plus select_across=1.
    page = admin_client.post(url, action_data("cancel", [pending[0].pk], select_across=True))
    html = page.content.decode()
    assert "5 messages selected (all matching the current filters and search)" in html
    assert 'name="select_across" value="1"' in html
    response = admin_client.post(url, confirm_data("cancel", [pending[0].pk], select_across=True))
    assert response["Location"] == url
    assert notes(response) == ["Cancelled 5 messages."]
    assert Message.objects.filter(status="cancelled").count() == 5
    assert Message.objects.get(pk=failed.pk).status == "failed"


def test_select_all_matching_a_payload_search(admin_client):
    hits = MessageFactory.create_batch(3, payload={"companyId": 3345})
    other = MessageFactory(payload={"companyId": 1})
    url = f"{CHANGELIST}?{urlencode({'q': 'companyId=3345'})}"
    response = admin_client.post(
        url, confirm_data("reprioritise", [hits[0].pk], select_across=True, priority="5")
    )
    assert notes(response) == ["Reprioritised 3 messages."]
    assert set(Message.objects.filter(priority=5).values_list("pk", flat=True)) == {
        m.pk for m in hits
    }
    assert Message.objects.get(pk=other.pk).priority == 0


def test_all_matching_is_one_statement_not_a_loop(admin_client, fake_clock):
    MessageFactory.create_batch(300, next_attempt_time=fake_clock() + timedelta(hours=1))
    some = Message.objects.first()
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.post(
            CHANGELIST, confirm_data("run_now", [some.pk], select_across=True)
        )
    assert notes(response) == ["Made due now 300 messages."]
    updates = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 1
    assert len(ctx.captured_queries) < 25


def test_an_action_without_a_selection_changes_nothing(admin_client, states):
    response = admin_client.post(CHANGELIST, action_data("cancel", []))
    assert response.status_code == 302
    assert "Items must be selected" in notes(response)[0]
    assert Message.objects.filter(status="cancelled").count() == 0


# -- the change page's buttons --------------------------------------------------------------


def test_change_page_button_runs_at_once_and_returns_to_the_message(admin_client, states):
    pk = states["pending_later"].pk
    response = admin_client.post(operation_url(pk, "cancel"), {"post": "yes"})
    assert response.status_code == 302 and response["Location"] == change_url(pk)
    assert notes(response) == ["Cancelled 1 message."]
    assert Message.objects.get(pk=pk).status == "cancelled"


def test_change_page_retry_button(admin_client, states):
    pk = states["failed"].pk
    admin_client.post(operation_url(pk, "retry_failed"), {"post": "yes", "extra_attempts": "1"})
    message = Message.objects.get(pk=pk)
    assert message.status == "pending" and message.max_attempts == 6


def test_change_page_reschedule_goes_through_the_form(admin_client, states, fake_clock):
    pk = states["pending_due"].pk
    page = admin_client.post(operation_url(pk, "reschedule"))
    assert page.status_code == 200 and 'name="delay"' in page.content.decode()
    response = admin_client.post(operation_url(pk, "reschedule"), {"post": "yes", "delay": "2h"})
    assert response["Location"] == change_url(pk)
    assert Message.objects.get(pk=pk).next_attempt_time == fake_clock() + timedelta(hours=2)


def test_change_page_button_on_a_running_message_reports_the_refusal(admin_client, states):
    pk = states["running"].pk
    response = admin_client.post(operation_url(pk, "cancel"), {"post": "yes"})
    assert notes(response) == [
        "Cancelled 0 messages. Skipped 1: 1 running: a worker holds its lease (wait until "
        "the attempt ends)."
    ]
    assert Message.objects.get(pk=pk).status == "running"


def test_operation_url_needs_post_a_known_operation_and_an_existing_message(admin_client, states):
    pk = states["pending_due"].pk
    assert admin_client.get(operation_url(pk, "cancel")).status_code == 405
    assert admin_client.post(operation_url(pk, "explode"), {"post": "yes"}).status_code == 404
    assert admin_client.post(operation_url(999999, "cancel"), {"post": "yes"}).status_code == 404
