"""A workflow in a real browser: from a step's page to the workflow's graph, a click on
a box, and the retry that lets the workflow go on."""

from __future__ import annotations

import os

import pytest

from django_delayq import enqueue
from django_delayq.models import Message
from django_delayq.testing import run_pending

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def shot(page, name: str) -> None:
    """Screenshots for a person to look at, when DELAYQ_SCREENSHOTS names a folder."""
    folder = os.environ.get("DELAYQ_SCREENSHOTS")
    if folder:
        page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=True)


def test_an_operator_follows_a_failed_workflow_and_retries_it(page, admin_login):
    charge = enqueue("steps", {"fail": 5}, key="charge-42")
    reserve = enqueue("steps", {"returns": {"reserved": 3}}, key="reserve-42")
    ship = enqueue("steps", {}, key="ship-42", after=[charge, reserve])
    email = enqueue("steps", {}, key="email-42", after=[ship], on_parent_failure="wait")
    run_pending("steps")
    base = admin_login()

    page.goto(f"{base}django_delayq/message/{ship.message.pk}/change/")
    assert "Cancelled: parent steps/charge-42" in page.inner_text("body")
    page.get_by_role("link", name="Show the workflow as a graph").click()
    graph = page.locator("svg.dq-workflow")
    graph.wait_for()
    statuses = {
        node.get_attribute("data-id"): node.get_attribute("data-status")
        for node in graph.locator("a.dq-node").all()
    }
    assert statuses == {
        str(charge.message.pk): "failed",
        str(reserve.message.pk): "succeeded",
        str(ship.message.pk): "cancelled",
        str(email.message.pk): "pending",
    }
    assert graph.locator("path.dq-edge").count() == 3
    shot(page, "workflow")

    Message.objects.filter(pk=charge.message.pk).update(payload={})
    page.get_by_role("button", name="Retry the failed steps").click()
    page.locator(".messagelist").wait_for()
    assert "Retry: 2 changed" in page.inner_text(".messagelist")
    run_pending("steps")
    page.reload()
    done = {
        node.get_attribute("data-status")
        for node in page.locator("svg.dq-workflow a.dq-node").all()
    }
    assert done == {"succeeded"}

    page.locator(f'svg.dq-workflow a.dq-node[data-id="{reserve.message.pk}"]').click()
    page.wait_for_url(f"**/message/{reserve.message.pk}/change/")
    assert "reserved" in page.inner_text("body")
