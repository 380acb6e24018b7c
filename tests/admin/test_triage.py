"""Failure triage: grouping by fingerprint, group actions, edit payload and retry."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_delayq import enqueue, triage
from django_delayq.fingerprint import fingerprint
from django_delayq.models import Message
from tests.admin.staff import staff_client
from tests.factories import MessageFactory
from tests.json_values import JSON_VALUES, exact

pytestmark = pytest.mark.django_db

FAILURES = reverse("admin:django_delayq_message_failures")
PAYMENT = "app.PaymentError: card {} declined for order {}"
KEY = "KeyError: 'user_id'"


def group_url(fp: str, action: str) -> str:
    return reverse("admin:django_delayq_message_failure_group", args=[fp, action])


def edit_url(message: Message) -> str:
    return reverse("admin:django_delayq_message_edit_payload", args=[message.pk])


def errored(error, now, *, status="failed", queue="default", ago=0, attempts=3, **kwargs):
    retrying = status == "pending"
    return MessageFactory(
        queue=queue,
        status=status,
        attempt_count=attempts,
        last_error=error,
        error_fingerprint=fingerprint(error),
        last_attempt_time=now - timedelta(minutes=ago),
        next_attempt_time=now + timedelta(minutes=10) if retrying else None,
        finished_at=None if retrying else now - timedelta(minutes=ago),
        **kwargs,
    )


@pytest.fixture
def groups(fake_clock):
    now = fake_clock()
    messages = {
        "old": errored(PAYMENT.format(4242, 17), now, ago=50),
        "new": errored(PAYMENT.format(1881, 923), now, ago=5),
        "retrying": errored(PAYMENT.format(1, 2), now, status="pending", queue="other", ago=20),
        "key": errored(KEY, now, ago=1),
        # Not to triage: it succeeded in the end; re-enqueued with its attempts reset.
        "recovered": errored(PAYMENT.format(3, 4), now, status="succeeded"),
        "reset": errored(PAYMENT.format(5, 6), now, status="pending", attempts=0),
    }
    MessageFactory()  # never failed
    return messages


@pytest.fixture
def viewer() -> Client:
    return staff_client("viewer", "view_message")[0]


@pytest.fixture
def operator() -> Client:
    return staff_client("operator", "view_message", "change_message")[0]


@pytest.mark.django_db(transaction=True)
def test_a_failed_attempt_stores_the_fingerprint_of_its_error(run_worker):
    first = enqueue("default", {"fail": 5}).message
    second = enqueue("default", {"fail": 5}).message
    run_worker(["default"])
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == "pending" and first.last_error.startswith("tests.testapp.handlers.Boom")
    assert first.error_fingerprint == fingerprint(first.last_error) != ""
    # "attempt 1 of message <id> failed": another id, the same group.
    assert first.last_error != second.last_error
    assert first.error_fingerprint == second.error_fingerprint


def test_failure_groups_merge_messages_of_the_same_bug(groups):
    found = triage.failure_groups()
    assert [g.count for g in found] == [3, 1]
    payment, key = found
    assert payment.fingerprint == fingerprint(PAYMENT.format(0, 0))
    assert (payment.failed, payment.retrying) == (2, 1)
    assert payment.queues == ("default", "other")
    assert payment.first_seen == groups["old"].last_attempt_time
    assert payment.last_seen == groups["new"].last_attempt_time
    assert payment.sample_id == max(groups[k].pk for k in ("old", "new", "retrying"))
    assert payment.error_type == "app.PaymentError"
    assert payment.normalised == "app.PaymentError: card <n> declined for order <n>"
    assert key.normalised == KEY and key.queues == ("default",)


def test_failure_groups_of_one_queue(groups):
    [only] = triage.failure_groups(["other"])
    assert (only.count, only.queues) == (1, ("other",))
    assert triage.failure_groups(["nothing-here"]) == []


def test_failure_groups_read_only_the_index_on_postgresql(groups, django_assert_max_num_queries):
    with django_assert_max_num_queries(2):
        triage.failure_groups()


def test_viewer_sees_groups_with_links_to_their_messages(groups, viewer):
    response = viewer.get(FAILURES)
    assert response.status_code == 200
    html = response.content.decode()
    assert "card &lt;n&gt; declined for order &lt;n&gt;" in html
    assert "Retry all" not in html and "Cancel all" not in html
    item = response.context["groups"][0]
    for link, expected in (("all", 3), ("failed", 2), ("retrying", 1)):
        listed = viewer.get(item["links"][link])
        assert listed.status_code == 200
        assert listed.context["cl"].result_count == expected, link
    assert viewer.get(item["links"]["sample"]).status_code == 200


def test_failures_page_filters_by_queue(groups, viewer):
    response = viewer.get(FAILURES, {"queue": "other"})
    [item] = response.context["groups"]
    assert item["group"].count == 1
    assert "queue=other" in item["links"]["all"]


def test_failures_page_shows_the_last_day_by_default_and_the_window_asked_for(
    groups, viewer, fake_clock
):
    now = fake_clock()
    for i, hours in enumerate((3, 30, 24 * 6, 24 * 8)):
        errored(PAYMENT.format(7, i), now, ago=60 * hours)

    def payment(seen: str | None = None) -> tuple[str, dict]:
        response = viewer.get(FAILURES, {} if seen is None else {"seen": seen})
        assert response.status_code == 200
        [item] = [
            i for i in response.context["groups"] if i["group"].error_type == "app.PaymentError"
        ]
        return response.context["seen"], item

    for seen, shown, expected in (
        (None, "24h", 4),
        ("1h", "1h", 3),
        ("24h", "24h", 4),
        ("7d", "7d", 6),
        ("all", "all", 7),
        ("nonsense", "24h", 4),
    ):
        window, item = payment(seen)
        assert (window, item["group"].count) == (shown, expected), seen
        # Each number links to the messages it counts: the window's.
        listed = viewer.get(item["links"]["all"])
        assert listed.context["cl"].result_count == expected, seen
    # The group's actions act on the whole group, whatever the window.
    assert "last_attempt_time" not in payment("1h")[1]["links"]["retry"]


def test_failure_groups_of_a_window_read_the_failing_index_alone_on_postgresql(groups):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's plan")
    with CaptureQueriesContext(connection) as captured:
        triage.failure_groups(since=timezone.now() - timedelta(days=1))
    grouping = captured.captured_queries[0]["sql"]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a handful of rows: the index
        cursor.execute("EXPLAIN " + grouping)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Only Scan using delayq_failing_idx" in plan, plan


def test_failures_page_without_failures(viewer):
    assert "No failed or retrying messages" in viewer.get(FAILURES).content.decode()


def test_operator_retries_a_whole_group_after_confirming(groups, operator, fake_clock):
    fp = fingerprint(PAYMENT.format(0, 0))
    assert "Retry all" in operator.get(FAILURES).content.decode()
    confirm = operator.get(group_url(fp, "retry"))
    assert confirm.status_code == 200
    assert confirm.context["preview"].changed == 3
    assert Message.objects.filter(status="failed").count() == 3  # a GET changes nothing

    response = operator.post(group_url(fp, "retry"), {"confirm": "yes", "extra_attempts": "2"})
    assert response.status_code == 302 and response.url == FAILURES
    now = fake_clock()
    for name in ("old", "new", "retrying"):
        message = Message.objects.get(pk=groups[name].pk)
        assert (message.status, message.next_attempt_time) == ("pending", now), name
    assert Message.objects.get(pk=groups["old"].pk).max_attempts == 3 + 2
    assert Message.objects.get(pk=groups["key"].pk).status == "failed"  # another group
    assert Message.objects.get(pk=groups["reset"].pk).next_attempt_time > now  # not triaged
    page = operator.get(FAILURES)
    assert "Retried 3 message(s)" in [m.message for m in page.context["messages"]][0]


def test_cancel_group_cancels_retrying_messages_and_leaves_failed_ones(groups, operator):
    fp = fingerprint(PAYMENT.format(0, 0))
    response = operator.post(group_url(fp, "cancel"), {"confirm": "yes"}, follow=True)
    assert Message.objects.get(pk=groups["retrying"].pk).status == "cancelled"
    assert Message.objects.get(pk=groups["old"].pk).status == "failed"
    [text] = [m.message for m in response.context["messages"]]
    assert "Cancelled 1 message(s)" in text and "Skipped 2" in text


def test_group_action_limited_to_one_queue(groups, operator):
    fp = fingerprint(PAYMENT.format(0, 0))
    response = operator.post(group_url(fp, "retry") + "?queue=default", {"confirm": "yes"})
    assert response.url == FAILURES + "?queue=default"
    assert Message.objects.get(pk=groups["old"].pk).status == "pending"
    retrying = Message.objects.get(pk=groups["retrying"].pk)
    assert retrying.next_attempt_time == groups["retrying"].next_attempt_time


def test_retry_group_rejects_a_bad_attempt_count(groups, operator):
    fp = fingerprint(PAYMENT.format(0, 0))
    response = operator.post(group_url(fp, "retry"), {"confirm": "yes", "extra_attempts": "0"})
    assert response.status_code == 200
    assert "Extra attempts must be" in response.content.decode()
    assert Message.objects.filter(status="failed").count() == 3


def test_group_actions_need_the_change_permission(groups, viewer):
    fp = fingerprint(PAYMENT.format(0, 0))
    for action in ("retry", "cancel"):
        assert viewer.get(group_url(fp, action)).status_code == 403
        assert viewer.post(group_url(fp, action), {"confirm": "yes"}).status_code == 403
    assert Message.objects.filter(status="failed").count() == 3
    assert Message.objects.get(pk=groups["retrying"].pk).status == "pending"


def test_unknown_group_action_or_empty_group(groups, operator):
    assert operator.get(group_url("abc", "explode")).status_code == 404
    response = operator.get(group_url("no-such-fingerprint", "retry"))
    assert response.status_code == 302 and response.url == FAILURES


def test_anonymous_users_are_sent_to_the_login_page(groups):
    fp = fingerprint(KEY)
    for url in (FAILURES, group_url(fp, "retry"), edit_url(groups["key"])):
        response = Client().post(url, {"confirm": "yes", "payload": "{}"})
        assert response.status_code == 302 and reverse("admin:login") in response.url
    assert Message.objects.get(pk=groups["key"].pk).status == "failed"


def test_group_action_needs_a_csrf_token(groups):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff_client("csrf-operator", "view_message", "change_message")[1])
    response = client.post(group_url(fingerprint(KEY), "retry"), {"confirm": "yes"})
    assert response.status_code == 403
    assert Message.objects.get(pk=groups["key"].pk).status == "failed"


# -- edit payload and retry ------------------------------------------------------------


def test_edit_payload_and_retry(groups, operator, fake_clock):
    message = groups["key"]
    Message.objects.filter(pk=message.pk).update(payload={"user": 1})
    form = operator.get(edit_url(message))
    assert form.status_code == 200
    assert '"user": 1' in form.context["payload_text"]
    assert "&quot;user&quot;: 1" in form.content.decode()

    response = operator.post(edit_url(message), {"payload": '{"user_id": 7, "tags": ["a"]}'})
    change = reverse("admin:django_delayq_message_change", args=[message.pk])
    assert response.status_code == 302 and response.url == change
    message.refresh_from_db()
    assert message.payload == {"user_id": 7, "tags": ["a"]}
    assert (message.status, message.next_attempt_time, message.finished_at) == (
        "pending",
        fake_clock(),
        None,
    )
    assert message.max_attempts == message.attempt_count + 1


def failed(message: Message, now) -> None:
    Message.objects.filter(pk=message.pk).update(
        status="failed", attempt_count=1, next_attempt_time=None, finished_at=now
    )


@pytest.mark.parametrize("value", JSON_VALUES)
def test_edit_payload_form_shows_every_json_payload_exactly(operator, fake_clock, value):
    message = enqueue("default", value).message
    failed(message, fake_clock())
    text = operator.get(edit_url(message)).context["payload_text"]
    assert exact(triage.parse_payload(text)) == exact(value)


@pytest.mark.parametrize("value", JSON_VALUES)
def test_edit_payload_and_retry_stores_every_json_payload_exactly(operator, fake_clock, value):
    message = enqueue("default", {"before": 1}).message
    failed(message, fake_clock())
    response = operator.post(edit_url(message), {"payload": json.dumps(value)})
    assert response.status_code == 302
    message.refresh_from_db()
    assert message.status == "pending"
    assert exact(message.payload) == exact(value)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{not json", "not valid JSON"),
        ('{"x": NaN}', "which JSON cannot hold"),
        ('{"x": "a\\u0000b"}', "NUL"),
    ],
)
def test_edit_payload_refuses_invalid_payloads(groups, operator, text, error):
    message = groups["key"]
    response = operator.post(edit_url(message), {"payload": text})
    assert response.status_code == 200
    assert error in response.content.decode()
    assert response.context["payload_text"] == text  # kept, for fixing
    message.refresh_from_db()
    assert (message.status, message.payload) == ("failed", {})


def test_edit_payload_does_not_clobber_a_message_changed_meanwhile(groups, operator):
    message = groups["key"]
    operator.get(edit_url(message))
    # A re-enqueue, another operator or a retry made it pending meanwhile.
    Message.objects.filter(pk=message.pk).update(status="pending", payload={"fresh": True})
    response = operator.post(edit_url(message), {"payload": '{"stale": true}'})
    assert response.status_code == 200
    assert "no longer failed" in response.content.decode()
    message.refresh_from_db()
    assert message.payload == {"fresh": True}


def test_edit_payload_needs_the_change_permission(groups, viewer):
    message = groups["key"]
    assert viewer.get(edit_url(message)).status_code == 403
    assert viewer.post(edit_url(message), {"payload": "{}"}).status_code == 403
    assert Message.objects.get(pk=message.pk).status == "failed"


def test_edit_payload_of_a_missing_message(operator):
    url = reverse("admin:django_delayq_message_edit_payload", args=[999999])
    assert operator.get(url).status_code == 404


def test_edit_payload_and_retry_function_is_guarded_by_status(groups):
    assert triage.edit_payload_and_retry(groups["retrying"].pk, {"a": 1}) is False
    assert Message.objects.get(pk=groups["retrying"].pk).payload == {}
    assert triage.edit_payload_and_retry(groups["old"].pk, {"a": 1}) is True
    with pytest.raises(TypeError):
        triage.edit_payload_and_retry(groups["new"].pk, {"a": object()})


def test_failed_message_change_page_links_to_edit_payload(groups, operator, viewer):
    change = reverse("admin:django_delayq_message_change", args=[groups["key"].pk])
    assert edit_url(groups["key"]) in operator.get(change).content.decode()
    assert edit_url(groups["key"]) not in viewer.get(change).content.decode()
    pending = reverse("admin:django_delayq_message_change", args=[groups["retrying"].pk])
    assert edit_url(groups["retrying"]) not in operator.get(pending).content.decode()


def test_retry_group_reports_nothing_skipped_when_all_were_retried(groups):
    result = triage.retry_group(fingerprint(PAYMENT.format(0, 0)))
    assert (result.changed, result.skipped) == (3, {})


def test_failure_pages_for_a_fingerprint_or_queue_with_nul_are_not_found(groups, operator):
    # Only a hand-made URL holds one; PostgreSQL cannot even compare with it.
    fp = fingerprint(PAYMENT.format(1, 2))
    assert operator.get(f"{FAILURES}?queue=a%00b").status_code == 404
    assert operator.get(FAILURES.rstrip("/") + f"/{fp}%00/retry/").status_code == 404
    assert operator.post(FAILURES.rstrip("/") + f"/{fp}%00/retry/").status_code == 404
    assert operator.get(group_url(fp, "retry") + "?queue=a%00b").status_code == 404
    assert operator.get(group_url(fp, "retry")).status_code == 200
