"""Business operations that produce messages.

The point of a queue in the database: the order and the messages it causes
are written in one transaction. If anything fails before the commit, there is
neither an order nor a message; once it commits, both exist, and a worker
will deliver the messages even if this process dies a moment later.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction

from django_delayq import EnqueueResult, enqueue
from orders.models import Order


def order_group(order_id: int) -> str:
    """The ordered group of an order's status events in the "orders" queue.

    The messages of one group run one at a time, in the order they were
    enqueued: an order's ``order.shipped`` never runs before its
    ``order.placed`` is done, even while that one waits for a retry.
    Different orders' events run side by side.
    """
    return f"order-{order_id}"


@dataclass(frozen=True)
class PlacedOrder:
    order: Order
    confirmation: EnqueueResult  # queue "orders", kind "order.placed", due now
    follow_up: EnqueueResult  # queue "emails", due after ORDERS_FOLLOW_UP_DELAY


def place_order(email: str, total: Decimal | str | int) -> PlacedOrder:
    """Create an order and enqueue its confirmation and follow-up email, atomically."""
    follow_up_delay = timedelta(seconds=settings.ORDERS_FOLLOW_UP_DELAY)
    with transaction.atomic():
        order = Order.objects.create(customer_email=email, total=Decimal(total))
        # Payloads are JSON: ids and strings (a Decimal travels as a string).
        confirmation = enqueue(
            "orders",
            {"order_id": order.pk, "email": email, "total": str(order.total)},
            key=f"confirm-{order.pk}",
            kind="order.placed",
            group=order_group(order.pk),
        )
        follow_up = enqueue(
            "emails",
            {
                "to": email,
                "subject": f"How was your order #{order.pk}?",
                "template": "follow-up",
                "order_id": order.pk,
            },
            key=f"follow-up-{order.pk}",
            delay=follow_up_delay,
        )
    return PlacedOrder(order, confirmation, follow_up)


def order_shipped(order_id: int, tracking_number: str) -> EnqueueResult:
    """Enqueue an order's ``order.shipped`` event, after its earlier events (its group).

    Called by the shipment's handler, in the transaction that books it.
    """
    return enqueue(
        "orders",
        {"order_id": order_id, "tracking_number": tracking_number},
        key=f"shipped-{order_id}-{tracking_number}",
        kind="order.shipped",
        group=order_group(order_id),
    )
