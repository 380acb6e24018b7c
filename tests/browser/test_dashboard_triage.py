"""The dashboard and the failures page in a real browser: pause a queue, retry a group."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.utils import timezone

from django_delayq.fingerprint import fingerprint
from django_delayq.models import Message, QueueState
from tests.factories import MessageFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def shot(page, name: str) -> None:
    """Screenshots for a person to look at, when DELAYQ_SCREENSHOTS names a folder."""
    folder = os.environ.get("DELAYQ_SCREENSHOTS")
    if folder:
        page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=True)


def make_traffic() -> None:
    now = timezone.now()
    for minute in range(60):
        for n in range(minute % 7 + 2):
            MessageFactory(
                queue="default" if n % 3 else "other",
                status="succeeded",
                next_attempt_time=None,
                attempt_count=1,
                finished_at=now - timedelta(minutes=minute, seconds=n),
            )
    for n in range(4):
        error = f"app.PaymentError: card {4000 + n} declined for order {n}"
        MessageFactory(
            status="failed",
            next_attempt_time=None,
            attempt_count=3,
            last_error=error,
            error_fingerprint=fingerprint(error),
            last_attempt_time=now - timedelta(minutes=n * 7),
            finished_at=now - timedelta(minutes=n * 7),
        )
    MessageFactory.create_batch(3, next_attempt_time=now - timedelta(seconds=40))


def test_operator_pauses_a_queue_and_retries_a_failure_group(page, admin_login):
    make_traffic()
    base = admin_login()
    page.goto(f"{base}django_delayq/")
    page.click("#delayq-pages >> text=Dashboard")
    page.wait_for_selector("svg.delayq-chart")
    assert page.locator("svg.delayq-chart g.bar").count() == 60
    shot(page, "dashboard-before-pause")

    row = page.locator('tr.queue[data-queue="default"]')
    row.locator('input[name="reason"]').fill("provider outage")
    row.locator('button[value="pause"]').click()
    page.wait_for_selector('tr.queue[data-queue="default"] .delayq-paused')
    assert QueueState.objects.get(queue="default").reason == "provider outage"
    shot(page, "dashboard-paused")

    page.click("text=Failures by error")
    page.wait_for_selector("#delayq-failures")
    shot(page, "failures")
    page.click("#delayq-failures >> text=Retry all")
    page.wait_for_selector("text=Messages whose last error is:")
    shot(page, "retry-confirm")
    page.click('input[type="submit"][value="Yes, retry them"]')
    page.wait_for_selector("text=Retried 4 message(s) of the group.")
    # Pending again after failed attempts: the group now counts them as retrying.
    assert page.locator("#delayq-failures tr.group td.num").all_inner_texts() == ["4", "0", "4"]
    assert not Message.objects.filter(status="failed").exists()
    shot(page, "failures-after-retry")
