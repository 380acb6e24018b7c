"""Flow control in a real browser: a throttled queue on the dashboard, then its blocked
groups and held messages through the changelist's filters."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from django_delayq import enqueue_many
from django_delayq.flow import limits_of
from django_delayq.store import claim, settle
from django_delayq.store.limits import claim_limited

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LEASE = timedelta(minutes=10)


def shot(page, name: str) -> None:
    """Screenshots for a person to look at, when DELAYQ_SCREENSHOTS names a folder."""
    folder = os.environ.get("DELAYQ_SCREENSHOTS")
    if folder:
        page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=True)


def make_flow(settings) -> dict[str, list[str]]:
    """ "default" throttled (3 of 3 an hour started, 2 due); in "other", group
    "order-17" blocked by its first message waiting for a retry, 2 held behind it."""
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"default": {"RATE_LIMIT": "3/h"}}}
    enqueue_many("default", [{}] * 5)
    assert len(claim_limited(["default"], 10, limits_of("default"), worker="w", lease=LEASE)
               .claim.messages) == 3  # fmt: skip
    keys = {group: [f"{group}-{i}" for i in range(3)] for group in ("order-17", "order-18")}
    for group, group_keys in keys.items():
        enqueue_many("other", [{}] * 3, keys=group_keys, group=group)
    heads = claim.claim(["other"], 10, worker="w", lease=LEASE)
    blocked = next(m for m in heads.messages if m.group == "order-17")
    error = "app.PaymentError: card declined"
    assert settle.fail(blocked.pk, heads.token, error=error, retry_at=None, retry_in=LEASE)
    return keys


def test_the_dashboard_shows_a_throttled_queue_and_the_blocked_groups_filter_works(
    page, admin_login, settings
):
    keys = make_flow(settings)
    base = admin_login()
    page.goto(f"{base}django_delayq/message/dashboard/")
    throttled = page.locator('#delayq-flow tr.flow.throttled[data-queue="default"]')
    throttled.wait_for()
    assert "3/3 per h" in throttled.inner_text()
    assert throttled.locator("a.delayq-throttled").inner_text() == "throttled"
    assert page.locator('tr.queue[data-queue="default"] .delayq-throttled').count() == 1
    assert page.locator('tr.queue[data-queue="other"] .delayq-throttled').count() == 0
    other = page.locator('#delayq-flow tr.flow[data-queue="other"]')
    assert other.locator("a.delayq-held").inner_text() == "4"
    assert other.locator("a.delayq-blocked-group").all_inner_texts() == ["order-17"]
    shot(page, "dashboard-flow-control")

    # The blocked count lists the first message of each blocked group.
    other.locator("a.delayq-blocked").click()
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 1
    assert keys["order-17"][0] in page.locator("#result_list").inner_text()

    # The same from the filter sidebar, then one group through the group box.
    page.goto(f"{base}django_delayq/message/")
    page.locator("#changelist-filter").get_by_role(
        "link", name="Blocked groups (their first message)"
    ).click()
    page.wait_for_url("**group_state=blocked**")
    assert page.locator("#result_list tbody tr").count() == 1
    page.goto(f"{base}django_delayq/message/?queue=other")
    page.fill("#dq-filter-group", "order-17")
    page.press("#dq-filter-group", "Enter")
    page.wait_for_url("**group=order-17**")
    assert "queue=other" in page.url
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 3
    assert page.locator("#result_list").inner_text().count("waiting for its group") == 2
    shot(page, "changelist-group")
