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

from django_delayq import enqueue
from orders.handlers import CarrierError, MailServerError
from orders.models import Order, Shipment
from orders.services import place_order

pytestmark = pytest.mark.django_db


def test_placing_an_order_enqueues_its_confirmation_and_follow_up(delayq):
    placed = place_order("ann@example.com", "42.50")

    delayq.assert_enqueued(
        "orders",
        key=f"confirm-{placed.order.pk}",
        kind="order.placed",
        payload={"order_id": placed.order.pk, "email": "ann@example.com", "total": "42.50"},
    )
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
