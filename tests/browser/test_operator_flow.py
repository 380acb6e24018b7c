"""An operator's round trip in a real browser.

Log in, find messages by a payload field, select them, reschedule them
through the action's intermediate form, read the outcome (changed and skipped
with the reason), and check the rows in the database. A second test opens a
message's change page and uses its buttons.

With ``DELAYQ_SCREENSHOTS=docs/screenshots`` the pages are saved for the
README (``make screenshots``). They show a project's admin, so the handlers
are those of a project whose queues are the scene's (``default`` and
``emails``), not the test app's dozens of queues, which the dashboard and the
queue filter would list.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from django_delayq import handler
from django_delayq.models import Message
from django_delayq.registry import registry
from tests.factories import MessageFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def project_handlers() -> Iterator[None]:
    """A project's handlers, for the scene's queues only, in place of the test app's
    while the test runs (the live server shares this process): the dashboard lists
    the queues of the registered handlers and the list's queue filter offers
    them, beside those of the rows."""
    handlers, models = dict(registry._handlers), dict(registry._models)
    registry._handlers.clear()
    registry._models.clear()
    try:

        @handler("default")
        def run_task(message: Message) -> None: ...

        @handler("emails")
        def send_email(message: Message) -> None: ...

        yield
    finally:
        registry._handlers.clear()
        registry._handlers.update(handlers)
        registry._models.clear()
        registry._models.update(models)


def shot(page, name: str, *, full_page: bool = False) -> None:
    folder = os.environ.get("DELAYQ_SCREENSHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=full_page)


REFUSED = "smtplib.SMTPRecipientsRefused: {'bob@example.com': (550, 'no such user')}"


def make_messages() -> dict[str, list[Message]]:
    now = timezone.now()
    ours = [
        MessageFactory(
            queue="default",
            key=f"invoice-{n}",
            kind="billing.InvoiceDue",
            payload={"companyId": 3345, "customer": {"id": 70 + n}, "amount": 100 * n},
            next_attempt_time=now + timedelta(minutes=5 * n),
        )
        for n in range(3)
    ]
    # Same company, but a worker holds it: the reschedule must skip it and say why.
    held = MessageFactory(
        queue="default",
        key="invoice-held",
        kind="billing.InvoiceDue",
        payload={"companyId": 3345, "customer": {"id": 99}},
        status="running",
        attempt_count=1,
        lock_token=uuid.uuid4(),
        locked_by="worker-1@host",
        next_attempt_time=now + timedelta(minutes=5),
        last_attempt_time=now,
    )
    others = [
        MessageFactory(
            queue="emails",
            key=f"welcome-{n}",
            kind="accounts.Welcome",
            payload={"companyId": 12, "customer": {"id": n}},
        )
        for n in range(4)
    ]
    MessageFactory(
        queue="emails",
        key="welcome-broken",
        kind="accounts.Welcome",
        payload={"companyId": 12},
        status="failed",
        attempt_count=3,
        max_attempts=3,
        next_attempt_time=None,
        finished_at=now,
        last_attempt_time=now,
        last_error=REFUSED,
        last_traceback='Traceback (most recent call last):\n  File "accounts/handlers.py", line 12,'
        f" in send_welcome\n{REFUSED}\n",
    )
    return {"ours": ours, "held": [held], "others": others}


def test_operator_finds_messages_by_payload_and_reschedules_them(page, admin_login):
    made = make_messages()
    base = admin_login()
    page.goto(f"{base}django_delayq/message/")
    assert page.locator("#result_list tbody tr").count() == 9
    shot(page, "changelist")

    page.fill("#searchbar", "companyId=3345")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=companyId*")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 4
    keys = page.locator("#result_list tbody td.field-key_display a.dq-key")
    assert sorted(keys.all_inner_texts()) == [
        "invoice-0",
        "invoice-1",
        "invoice-2",
        "invoice-held",
    ]
    shot(page, "changelist-search")

    page.check("#action-toggle")
    page.select_option("select[name=action]", "reschedule")
    page.click("button[name=index]")
    page.wait_for_selector("body.delayq-action-confirmation")
    summary = page.locator("ul.dq-summary").inner_text()
    assert "4 messages selected" in summary and "3 will change" in summary
    shot(page, "action-reschedule")

    page.fill("#id_delay", "2h")
    page.click("input[type=submit][value^='Yes, change']")
    success = page.locator("ul.messagelist li").first
    success.wait_for()
    text = success.inner_text()
    assert text.startswith("Rescheduled 3 messages.") and "Skipped 1:" in text, text

    later = timezone.now() + timedelta(hours=2)
    for message in made["ours"]:
        message.refresh_from_db()
        assert message.status == "pending"
        assert abs(message.next_attempt_time - later) < timedelta(minutes=1)
    held = Message.objects.get(pk=made["held"][0].pk)
    assert held.status == "running" and held.next_attempt_time < later - timedelta(hours=1)
    untouched = Message.objects.filter(pk__in=[m.pk for m in made["others"]])
    assert all(m.next_attempt_time < later - timedelta(hours=1) for m in untouched)


def test_operator_reads_a_failure_and_retries_it_from_the_change_page(page, admin_login):
    make_messages()
    failed = Message.objects.get(key="welcome-broken")
    base = admin_login()
    page.goto(f"{base}django_delayq/message/?status__exact=failed")
    assert page.locator("#result_list tbody tr").count() == 1
    page.click(f'#result_list a[href*="/{failed.pk}/change/"]')
    page.wait_for_selector("text=SMTPRecipientsRefused")
    assert "Traceback (most recent call last)" in page.content()
    shot(page, "change-page", full_page=True)

    page.click("button.dq-op-button[value=retry_failed]")
    page.locator("ul.messagelist li").first.wait_for()
    failed.refresh_from_db()
    assert failed.status == "pending"
    assert failed.max_attempts == 4


def test_dashboard_screenshot_with_traffic(page, admin_login):
    """The dashboard with live-looking figures (kept apart so the README's picture is full)."""
    now = timezone.now()
    for minute in range(0, 60, 2):
        MessageFactory.create_batch(
            minute % 5 + 1,
            queue="emails" if minute % 3 else "default",
            status="succeeded",
            next_attempt_time=None,
            attempt_count=1,
            finished_at=now - timedelta(minutes=minute),
        )
    make_messages()
    base = admin_login()
    page.goto(f"{base}django_delayq/message/dashboard/")
    page.wait_for_selector("svg.delayq-chart")
    assert page.locator('tr.queue[data-queue="emails"]').count() == 1
    shot(page, "dashboard")
