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
from django_delayq.admin.messages import MessageAdmin
from django_delayq.fingerprint import fingerprint
from django_delayq.queues import pause_queue
from tests.factories import MessageFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = [1280, 1400]

# Every element of the list's header row and of the dashboard's tables,
# forms and charts, and how far each reaches to the right of the window
# or of the box that scrolls it. Then inside the tables: what does not fit
# its box is wrapped, or cut (an ellipsis, a line clamp) with the whole text
# in a title, and not cut to a sliver; nothing spills over its neighbours.
OVERFLOWS = """
([selector, inside]) => {
  const width = document.documentElement.clientWidth;
  const out = [];
  const name = (el) => (el.innerText || el.getAttribute('name') || el.tagName).trim().slice(0, 40);
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
      out.push(`${name(el)} ends at ${Math.round(r.right)} px`);
    }
  }
  for (const el of document.querySelectorAll(inside)) {
    if (!el.clientWidth) continue;  // an inline box: the block holding it is checked
    const style = getComputedStyle(el);
    const wide = el.scrollWidth > el.clientWidth + 1;
    const tall = style.overflowY !== 'visible' && el.scrollHeight > el.clientHeight + 1;
    if (!wide && !tall) continue;
    const cell = el.closest('td, th');
    const above = el.closest('[title]');
    const titled = el.querySelector('[title]') || (above && cell && cell.contains(above));
    if (style.overflowX === 'visible') {
      out.push(`${name(el)} spills out: ${el.scrollWidth} px in ${el.clientWidth}`);
    } else if (!titled) {
      out.push(`${name(el)} is cut off with no title to read it whole`);
    } else if (el.clientWidth < 60) {
      out.push(`${name(el)} is cut to ${el.clientWidth} px`);
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


def column(name: str) -> int:
    """A column's number in the list's ``?o=`` (the checkbox is 0)."""
    return ["action_checkbox", *MessageAdmin.list_display].index(name)


# The list as it opens, and narrowed to pending messages and sorted by the
# four sortable columns (a sorted column's header holds its sort buttons).
SORTED = ".".join(
    str(column(name)) for name in ("priority", "next_attempt", "status_display", "id")
)
LISTS = ["", f"?status__exact=pending&o=-{SORTED}"]


@pytest.mark.parametrize("query", LISTS)
@pytest.mark.parametrize("width", WIDTHS)
def test_the_message_list_fits(page, admin_login, width, query):
    realistic_messages()
    page.set_viewport_size({"width": width, "height": 900})
    base = admin_login()
    page.goto(f"{base}django_delayq/message/{query}")
    page.wait_for_selector("#result_list")
    if query:
        assert page.locator("#result_list thead th.sorted").count() == 4
    shot(page, f"message-list-{width}{'-sorted' if query else ''}")
    selectors = ["#result_list th, #result_list td, #changelist-filter", "#result_list *"]
    assert page.evaluate(OVERFLOWS, selectors) == []


@pytest.mark.parametrize("width", WIDTHS)
def test_the_dashboard_fits(page, admin_login, width):
    realistic_messages()
    # A paused queue shows its reason and a Resume button instead of the form.
    pause_queue("payments-eu-west", by="operator", reason="provider outage, see incident 4711")
    page.set_viewport_size({"width": width, "height": 900})
    base = admin_login()
    page.goto(f"{base}django_delayq/message/dashboard/")
    page.wait_for_selector("#content-main")
    shot(page, f"dashboard-{width}")
    selector = "#content table th, #content table td, #content form, #content svg, #content button"
    assert page.evaluate(OVERFLOWS, [selector, "#content table *"]) == []
