"""The message list and the dashboard fit a laptop's screen: at 1,280 and 1,400 px
wide no column of the list and no control of the dashboard is cut off or pushed
past the window (Django's list scrolls its table sideways inside the page, so a
column out of view is one an operator does not know is there)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.utils import timezone

from django_delayq import enqueue
from django_delayq.fingerprint import fingerprint
from tests.factories import MessageFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = [1280, 1400]

# Every element of the list's header row and of the dashboard's tables,
# forms and charts, and how far each reaches to the right of the window
# or of the box that scrolls it.
OVERFLOWS = """
(selector) => {
  const width = document.documentElement.clientWidth;
  const out = [];
  if (document.documentElement.scrollWidth > width) {
    out.push(`the page is ${document.documentElement.scrollWidth} px wide`);
  }
  for (const box of document.querySelectorAll('.results')) {
    if (box.scrollWidth > box.clientWidth) {
      out.push(`the list scrolls: ${box.scrollWidth} px in ${box.clientWidth}`);
    }
  }
  for (const el of document.querySelectorAll(selector)) {
    const r = el.getBoundingClientRect();
    if (r.width && r.right > width + 0.5) {
      const name = (el.innerText || el.getAttribute('name') || el.tagName).trim();
      out.push(`${name.slice(0, 40)} ends at ${Math.round(r.right)} px`);
    }
  }
  return out;
}
"""


def shot(page, name: str) -> None:
    folder = os.environ.get("DELAYQ_SCREENSHOTS")
    if folder:
        page.screenshot(path=os.path.join(folder, f"{name}.png"))


def realistic_messages() -> None:
    """What a list holds on a working day: long keys, errors, groups, kinds, ticks."""
    now = timezone.now()
    for n in range(6):
        error = (
            f"app.payments.PaymentProviderError: card ending {4000 + n} was declined by "
            "the issuer (do_not_honor) while charging order #A-2026-118-7731"
        )
        MessageFactory(
            queue="payments-eu-west",
            key=f"order-2026-11-28-{n:04d}-customer-8f1c2a7e-43b9-4d6e-9a1f-{n:012d}",
            kind="charge_card_with_3ds_fallback",
            group=f"customer-8f1c2a7e-43b9-{n}",
            status="failed" if n % 2 else "pending",
            attempt_count=3,
            last_error=error,
            error_fingerprint=fingerprint(error),
            next_attempt_time=now + timedelta(minutes=n) if n % 2 == 0 else None,
        )
    enqueue("default", {"n": 1}, key="welcome-ann@example.com", priority=5)


# Known, not fixed yet: eleven columns need about 1,150 px, and beside Django's
# app list and the filters the list has 631 px at 1,280 and 751 at 1,400.
@pytest.mark.xfail(strict=True, reason="known: the message list needs about 1,900 px")
@pytest.mark.parametrize("width", WIDTHS)
def test_the_message_list_fits(page, admin_login, width):
    realistic_messages()
    page.set_viewport_size({"width": width, "height": 900})
    base = admin_login()
    page.goto(f"{base}django_delayq/message/")
    page.wait_for_selector("#result_list")
    shot(page, f"message-list-{width}")
    assert page.evaluate(OVERFLOWS, "#result_list th, #changelist-filter") == []


# Known, not fixed yet: the queue table's 17 columns and its pause controls
# make the page about 1,590 px wide.
@pytest.mark.xfail(strict=True, reason="known: the dashboard's queue table needs about 1,600 px")
@pytest.mark.parametrize("width", WIDTHS)
def test_the_dashboard_fits(page, admin_login, width):
    realistic_messages()
    page.set_viewport_size({"width": width, "height": 900})
    base = admin_login()
    page.goto(f"{base}django_delayq/message/dashboard/")
    page.wait_for_selector("#content-main")
    shot(page, f"dashboard-{width}")
    selector = "#content table th, #content table td, #content form, #content svg, #content button"
    assert page.evaluate(OVERFLOWS, selector) == []
