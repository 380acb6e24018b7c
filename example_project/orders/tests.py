"""Tests of the orders app, with django-delayq's testing helpers.

The ``delayq`` fixture runs due messages in this test's thread and
transaction (``delayq.run_pending``), checks what was enqueued
(``delayq.assert_enqueued``) and moves the queue's clock
(``delayq.advance``) so delayed messages and retries come due without
sleeping. Run with ``.venv/bin/pytest example_project``.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.conf import settings

from django_delayq import enqueue, wait
from orders.handlers import PAYMENT_CHECK_DELAY, CarrierError, MailServerError
from orders.models import Order, Shipment
from orders.services import order_group, place_order

pytestmark = pytest.mark.django_db


def test_placing_an_order_enqueues_its_confirmation_and_follow_up(delayq):
    placed = place_order("ann@example.com", "42.50")

    [confirmation] = delayq.assert_enqueued(
        "orders",
        key=f"confirm-{placed.order.pk}",
        kind="order.placed",
        payload={"order_id": placed.order.pk, "email": "ann@example.com", "total": "42.50"},
    )
    assert confirmation.group == order_group(placed.order.pk) == f"order-{placed.order.pk}"
    [follow_up] = delayq.assert_enqueued("emails", key=f"follow-up-{placed.order.pk}")
    assert follow_up.payload["subject"] == f"How was your order #{placed.order.pk}?"


def test_the_confirmation_confirms_the_order_and_the_follow_up_waits(delayq):
    placed = place_order("ann@example.com", Decimal("42.50"))

    [confirmation] = delayq.run_pending("orders")
    assert confirmation.result == "succeeded"
    placed.order.refresh_from_db()
    assert placed.order.status == Order.Status.CONFIRMED

    assert delayq.run_pending("emails") == []  # not due yet
    delayq.advance(seconds=settings.ORDERS_FOLLOW_UP_DELAY)
    [email] = delayq.run_pending("emails")
    assert (email.key, email.result) == (f"follow-up-{placed.order.pk}", "succeeded")


def test_a_confirmation_for_a_missing_order_is_discarded(delayq):
    enqueue("orders", {"order_id": 999_999}, kind="order.placed")

    [attempt] = delayq.run_pending("orders")

    assert attempt.result == "discarded"
    assert attempt.message.last_error == "Discarded: order #999999 does not exist"


def test_a_refused_email_is_retried_with_backoff_then_failed(delayq):
    placed = place_order("bob@fail.example", 10)
    delayq.run_pending("orders")

    # run_all moves the clock to each retry: DELAYQ["MAX_ATTEMPTS"] is 3.
    attempts = delayq.run_all("emails")

    assert [a.result for a in attempts] == ["retrying", "retrying", "failed"]
    assert all(isinstance(a.exception, MailServerError) for a in attempts)
    assert attempts[-1].message.key == f"follow-up-{placed.order.pk}"
    assert attempts[-1].message.status == "failed"


def test_a_shipment_row_is_booked_and_an_undeliverable_one_retried(delayq):
    order = place_order("ann@example.com", "42.50").order
    good = Shipment(order=order, address="1 Main Street")
    good.schedule()  # the row is the message: no enqueue
    bad = Shipment(order=order, address="Nowhere Lane 0")
    bad.schedule(delay=60)

    [booked] = delayq.run_pending("shipments")
    assert (booked.message.pk, booked.result) == (good.pk, "succeeded")
    good.refresh_from_db()
    assert good.status == "succeeded" and good.tracking_number.startswith("TRK-")

    delayq.advance(seconds=60)
    [refused] = delayq.run_pending("shipments")
    assert (refused.message.pk, refused.result) == (bad.pk, "retrying")
    assert isinstance(refused.exception, CarrierError)
    assert refused.message.status == "pending" and refused.message.attempt_count == 1


def test_an_orders_shipped_event_waits_in_its_group_for_the_payment_check(delayq):
    order = place_order("carol@example.com", "150.00").order

    [check] = delayq.run_pending("orders")
    assert check.result == "snoozed"  # orders of 100 or more: the payment check is pending

    # The shipment is booked meanwhile; its handler enqueues the order's
    # order.shipped, behind order.placed in the order's group: it is held.
    Shipment(order=order, address="1 Main Street").schedule()
    [booked] = delayq.run_pending("shipments")
    assert booked.result == "succeeded"
    [shipped] = delayq.assert_enqueued("orders", kind="order.shipped")
    assert shipped.group == order_group(order.pk)
    assert shipped.next_attempt_time is None  # no due time until order.placed is done
    assert delayq.run_pending("orders") == []

    delayq.advance(seconds=PAYMENT_CHECK_DELAY)
    attempts = delayq.run_pending("orders")
    assert [(a.message.kind, a.result) for a in attempts] == [
        ("order.placed", "succeeded"),
        ("order.shipped", "succeeded"),
    ]
    order.refresh_from_db()
    assert order.status == Order.Status.SHIPPED


def test_another_orders_events_do_not_wait(delayq):
    slow = place_order("carol@example.com", "150.00").order
    quick = place_order("dave@example.com", "5.25").order

    attempts = delayq.run_pending("orders")

    assert sorted((a.message.payload["order_id"], a.result) for a in attempts) == [
        (slow.pk, "snoozed"),
        (quick.pk, "succeeded"),
    ]


def test_the_partner_is_told_of_an_order_by_an_async_handler(delayq, caplog):
    placed = place_order("ann@example.com", "42.50")
    enqueue("partners", {"order_id": placed.order.pk})

    with caplog.at_level("INFO", logger="orders"):
        [attempt] = delayq.run_pending("partners")

    assert attempt.result == "succeeded"
    assert f"partner told of order #{placed.order.pk} (ann@example.com)" in caplog.text


def test_the_sales_report_totals_its_lines_after_they_all_ran(delayq):
    from django_delayq import enqueue_many
    from django_delayq.models import Message

    orders = [place_order(f"r{i}@example.com", total).order for i, total in enumerate([10, 32])]
    lines = enqueue_many("reports", [{"order_id": o.pk} for o in orders], kind="report.order")
    report = enqueue("reports", kind="report.total", after=lines)
    assert Message.objects.get(pk=report.message.pk).waiting_for_parents

    attempts = delayq.run_pending("reports")

    assert [a.message.kind for a in attempts] == ["report.order", "report.order", "report.total"]
    assert Message.objects.get(pk=report.message.pk).result == {"orders": 2, "total": "42.00"}
    # What a script waiting for the report gets (a worker runs it there; here
    # it already ran): its result. On PostgreSQL a notification wakes the wait.
    assert wait(report, timeout=5) == {"orders": 2, "total": "42.00"}


def test_the_shipping_summary_waits_for_every_shipment_row_booked_or_failed(delayq):
    from django_delayq.models import Message
    from orders.models import Shipment

    good = place_order("ship@example.com", "10.00").order
    bad = place_order("lost@fail.example", "12.00").order
    rows = [Shipment(order=good, address="1 Main Street"), Shipment(order=bad, address="Nowhere")]
    for row in rows:
        row.schedule()
    summary = enqueue(
        "reports", kind="report.shipping", after=rows, on_parent_failure="run"
    ).message
    assert Message.objects.get(pk=summary.pk).waiting_for_parents

    delayq.run_all(["shipments", "reports"])

    assert [Shipment.objects.get(pk=r.pk).status for r in rows] == ["succeeded", "failed"]
    assert Message.objects.get(pk=summary.pk).result == {"booked": 1, "failed": 1}
