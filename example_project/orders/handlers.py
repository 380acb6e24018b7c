"""Consumers of the example's queues.

django_delayq imports every installed app's ``handlers.py`` at start-up, so
``manage.py run_delayq`` knows these before it claims anything.
"""

from __future__ import annotations

import asyncio
import logging
from decimal import Decimal

from django_delayq import Discard, Retry, handler, tick_of
from django_delayq.entity import row_of
from django_delayq.models import Message
from orders.models import Order, Shipment
from orders.services import order_shipped

logger = logging.getLogger("orders")

# Orders of this total or more wait for a payment check before they are
# confirmed. The demo's check is still pending at its first look and clear at
# the next, PAYMENT_CHECK_DELAY seconds later; meanwhile the order's later
# events wait in its group (orders/services.py: order_group).
PAYMENT_CHECK_TOTAL = 100
PAYMENT_CHECK_DELAY = 2


@handler("orders", kind="order.placed", atomic=True)
def confirm_order(message: Message) -> None:
    """Mark the order confirmed.

    ``atomic=True``: this handler's writes and the message's acknowledgement
    commit in one transaction, so the order is confirmed exactly when the
    message is marked succeeded; if the worker dies halfway, both roll back
    and the redelivered message simply does the work again.
    """
    order_id = message.payload["order_id"]
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        # Retrying cannot make a missing order appear: give up at once (the
        # message is kept as failed, with this reason, for an operator).
        raise Discard(f"order #{order_id} does not exist")
    if order.total >= PAYMENT_CHECK_TOTAL and not message.is_redelivery:
        # A snooze: no error recorded, no attempt spent. The message stays
        # pending, so it keeps its group (the order's later events) waiting.
        logger.info("order #%s: payment check pending, looking again shortly", order.pk)
        raise Retry(delay=PAYMENT_CHECK_DELAY, reason="payment check pending")
    if order.status == Order.Status.NEW:
        order.status = Order.Status.CONFIRMED
        order.save(update_fields=["status"])
    logger.info("order #%s confirmed (%s, total %s)", order.pk, order.customer_email, order.total)


class OutOfOrder(Exception):
    """An order event met an order that is not in the state it follows."""


@handler("orders", kind="order.shipped", atomic=True)
def mark_shipped(message: Message) -> None:
    """Mark the order shipped, once its shipment is booked.

    The event is in the order's group, behind its ``order.placed``: it runs
    only once that one is done, so the order is confirmed by then, however
    long the confirmation took and however many workers run the queue.
    """
    order = Order.objects.get(pk=message.payload["order_id"])
    if order.status == Order.Status.NEW:
        raise OutOfOrder(f"order #{order.pk} shipped before it was confirmed")
    order.status = Order.Status.SHIPPED
    order.save(update_fields=["status"])
    logger.info("order #%s shipped (%s)", order.pk, message.payload["tracking_number"])


class MailServerError(Exception):
    """What a real mail client raises when the server refuses a message."""


@handler("emails")
def send_email(message: Message) -> None:
    """Send an email (here: log it).

    Not atomic (the default): a real implementation talks to a mail server,
    which should not happen while a database transaction is held open. An
    exception marks the attempt failed; the message is retried with backoff
    and marked failed after DELAYQ["MAX_ATTEMPTS"] attempts.
    """
    to = message.payload["to"]
    if to.endswith("@fail.example"):
        raise MailServerError(f"550 mailbox unavailable: {to}")
    late = (message.last_attempt_time - message.scheduled_time).total_seconds()
    logger.info(
        "email sent to %s: %r (%s, %.1f s after its due time)",
        to,
        message.payload.get("subject", ""),
        message.key,
        late,
    )


@handler("partners", concurrency=20, time_limit=10)
async def notify_partner(message: Message) -> None:
    """Tell the fulfilment partner's API of a placed order (here: a pretend HTTP call).

    ``async def``: it runs as a coroutine on the worker's event loop, so
    twenty of these wait on the partner's API together without twenty
    threads (``concurrency=20``, beside the worker's ``--concurrency``).
    Its database reads use Django's async ORM. Past ``time_limit`` the
    coroutine is cancelled and the attempt retried.
    """
    order = await Order.objects.aget(pk=message.payload["order_id"])
    await asyncio.sleep(0.2)  # stands for: await client.post(PARTNER_URL, json=...)
    logger.info("partner told of order #%s (%s)", order.pk, order.customer_email)


@handler("reports", kind="report.order")
def report_order(message: Message) -> dict[str, object]:
    """One order's line of the sales report: its return value is stored as the
    message's ``result``, for the step that runs after it (``report.total``)."""
    order = Order.objects.get(pk=message.payload["order_id"])
    return {"order": order.pk, "total": str(order.total)}


@handler("reports", kind="report.total")
def report_total(message: Message) -> dict[str, object]:
    """The sales report's total, enqueued ``after=`` every order's line: it runs
    once they have all finished, and reads what they returned (in ``after=`` order)."""
    lines = message.parent_results
    total = sum(Decimal(line["total"]) for line in lines)
    logger.info("sales report: %d orders, %s in total", len(lines), total)
    return {"orders": len(lines), "total": str(total)}


@handler("reports", kind="report.shipping")
def report_shipping(message: Message) -> dict[str, object]:
    """The shipping summary, enqueued ``after=`` the ``Shipment`` rows with
    ``on_parent_failure="run"``: it runs once every shipment is booked or has
    failed. Its parents stand for the rows; ``row_of`` reads each one."""
    rows = [row_of(parent) for parent in message.parents()]
    booked = [row for row in rows if isinstance(row, Shipment) and row.tracking_number]
    failed = len(rows) - len(booked)
    logger.info("shipping summary: %d booked, %d failed", len(booked), failed)
    return {"booked": len(booked), "failed": failed}


@handler("ops")
def heartbeat(message: Message) -> None:
    """One tick of the ``heartbeat`` schedule (DELAYQ["SCHEDULES"] in settings.py).

    The payload is the schedule's, untouched; ``tick_of`` tells which
    occurrence this is and how late it started.
    """
    tick = tick_of(message)
    if tick is None:
        raise Discard("the ops queue only takes schedule ticks")
    backlog = Order.objects.filter(status=Order.Status.NEW).count()
    logger.info(
        "%s tick of %s (%s, started %.1f s after its time): %d unconfirmed order(s)",
        tick.name,
        tick.time.strftime("%H:%M:%S"),
        message.payload["check"],
        tick.late_by.total_seconds(),
        backlog,
    )


class CarrierError(Exception):
    """What a real carrier's API raises when it refuses a booking."""


@handler("shipments", model=Shipment, atomic=True)
def book_shipment(shipment: Shipment) -> None:
    """Book a parcel with the carrier (here: make up a tracking number).

    Registered for the ``Shipment`` model: the worker claims due shipment
    rows themselves and passes each row in. ``atomic=True``: the tracking
    number, the order's ``order.shipped`` event and the row's ``succeeded``
    commit together. Save only your own columns (``update_fields``): the
    queue columns are the worker's.
    """
    if "nowhere" in shipment.address.lower():
        raise CarrierError(f"address not deliverable: {shipment.address!r}")
    shipment.tracking_number = f"TRK-{shipment.order_id:04d}-{shipment.pk:04d}"
    shipment.save(update_fields=["tracking_number"])
    order_shipped(shipment.order_id, shipment.tracking_number)
    logger.info(
        "shipment #%s of order #%s booked: %s (attempt %s)",
        shipment.pk,
        shipment.order_id,
        shipment.tracking_number,
        shipment.attempt_count,
    )
