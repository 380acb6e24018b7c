"""``manage.py seed_demo``: place a few orders and enqueue emails for the demo.

Shows the producer side of django-delayq: an order and its messages in one
transaction (and gone together on rollback), delayed delivery, a batch with
``enqueue_many``, keys that make a repeated enqueue harmless, a task of
Django's Tasks framework (``orders/tasks.py``) enqueued through DelayQBackend,
shipments whose rows are their own queue messages (``QueueFields``), each
order's events in an ordered group, a rate-limited emails queue, an
``async def`` handler's queue (the partner's API), and workflows (a report
step per order, then a total enqueued ``after=`` them; a shipping summary
``after=`` the shipment rows).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction

from django_delayq import EnqueueResult, enqueue, enqueue_many
from django_delayq.flow import parse_rate
from django_delayq.models import Message
from orders.handlers import PAYMENT_CHECK_DELAY, PAYMENT_CHECK_TOTAL
from orders.models import Order, Shipment
from orders.services import order_group, place_order
from orders.tasks import send_receipt

CUSTOMERS = [
    ("alice@example.com", "42.50"),
    ("bob@example.com", "17.00"),
    ("carol@example.com", "108.99"),
    ("dave@example.com", "5.25"),
    # Its emails are refused by the (pretend) mail server: retried, then failed.
    ("broken@fail.example", "12.00"),
]
WELCOME_DELAY = 2
NEWSLETTER_DELAY = 3
SHIPMENT_DELAY = 1


class _Abort(Exception):
    pass


class Command(BaseCommand):
    help = "Place demo orders and enqueue demo emails (see scripts/demo.sh)."

    def handle(self, *args: Any, **options: Any) -> None:
        out = self.stdout.write
        out("Placing orders (each order and its two messages in one transaction):")
        for email, total in CUSTOMERS:
            placed = place_order(email, total)
            out(
                f"  order #{placed.order.pk:<3} {email:<22} {placed.order.total:>7}   "
                f"{describe(placed.confirmation)}, {describe(placed.follow_up)}"
            )
        out(
            f"  Each order's events run in its ordered group ({order_group(1)}, ...): one at a "
            "time, in order.\n"
            "  Its order.shipped (enqueued when its shipment is booked) waits for its "
            "order.placed; orders of\n"
            f"  {PAYMENT_CHECK_TOTAL} or more wait {PAYMENT_CHECK_DELAY} s for a payment check "
            "(order.placed snoozes), and their order.shipped with them."
        )
        setting = settings.DELAYQ["QUEUES"]["emails"]["RATE_LIMIT"]
        rate = parse_rate(setting)
        out(
            f"The emails queue has RATE_LIMIT {setting!r} (settings.py): at most {rate.count} "
            f"emails start in any {rate.period.total_seconds():g} s,\nacross every worker; "
            "the others wait, due, with no attempt spent."
        )

        orders = list(Order.objects.order_by("pk").values_list("pk", flat=True))
        enqueue_many(
            "partners",
            [{"order_id": pk} for pk in orders],
            keys=[f"partner-{pk}" for pk in orders],
        )
        out(
            f"The partner's API is told of the {len(orders)} orders by an async def handler "
            "(partners):\n  coroutines on the worker's event loop, up to 20 at once."
        )

        with transaction.atomic():
            lines = enqueue_many(
                "reports",
                [{"order_id": pk} for pk in orders],
                keys=[f"report-{pk}" for pk in orders],
                kind="report.order",
            )
            report = enqueue("reports", key="report-total", kind="report.total", after=lines)
        out(
            f"A sales report as a workflow: {len(lines)} report.order messages, then "
            f"{report.message.key} after=[all of them]\n  (it waits for them, then reads "
            "their results as message.parent_results)."
        )

        out("Placing an order whose transaction then fails:")
        try:
            with transaction.atomic():
                placed = place_order("rollback@example.com", "99.00")
                raise _Abort
        except _Abort:
            pass
        keys = [placed.confirmation.message.key, placed.follow_up.message.key]
        out(
            f"  rolled back: orders for rollback@example.com: "
            f"{Order.objects.filter(customer_email='rollback@example.com').count()}, "
            f"messages {' / '.join(keys)}: {Message.objects.filter(key__in=keys).count()}"
        )

        out(f"Welcome emails with enqueue() (due in {WELCOME_DELAY} s):")
        for email, _ in CUSTOMERS[:3]:
            result = enqueue(
                "emails",
                {"to": email, "subject": "Welcome to the shop!", "template": "welcome"},
                key=f"welcome-{email}",
                delay=WELCOME_DELAY,
            )
            out(f"  {describe(result)}")

        recipients = [email for email, _ in CUSTOMERS[1:4]]
        payloads = [
            {"to": email, "subject": "Newsletter #42", "template": "newsletter"}
            for email in recipients
        ]
        keys = [f"newsletter-42-{email}" for email in recipients]
        out(f"Newsletter #42 with enqueue_many() (one batch, due in {NEWSLETTER_DELAY} s):")
        for result in enqueue_many("emails", payloads, keys=keys, delay=NEWSLETTER_DELAY):
            out(f"  {describe(result)}")

        out("The same batch again, as a retried job would send it:")
        results = enqueue_many("emails", payloads, keys=keys, delay=NEWSLETTER_DELAY)
        out(f"  {', '.join(r.outcome.value for r in results)}  (the keys already exist)")

        first = Order.objects.order_by("pk").first()
        assert first is not None
        result = enqueue(
            "orders",
            {"order_id": first.pk, "email": first.customer_email, "total": str(first.total)},
            key=f"confirm-{first.pk}",
            kind="order.placed",
            group=order_group(first.pk),
        )
        out(
            f"confirm-{first.pk} enqueued again: {result.outcome.value} "
            f"(still one message, #{result.message.pk})"
        )

        out("A receipt as a Django task (TASKS: DelayQBackend), in the order's transaction:")
        with transaction.atomic():
            receipt = send_receipt.enqueue(first.pk)
        out(
            f"  send_receipt.enqueue({first.pk}): task {receipt.id} {receipt.status} "
            f"(queue {receipt.task.queue_name}, priority {receipt.task.priority})"
        )

        out(f"Shipments (orders.Shipment rows, queued by schedule(); due in {SHIPMENT_DELAY} s):")
        for order in Order.objects.order_by("pk"):
            # The carrier refuses this address: retried, then failed.
            broken = order.customer_email.endswith("@fail.example")
            address = "Nowhere Lane 0" if broken else f"{order.pk} Main Street"
            shipment = Shipment(order=order, address=address)
            shipment.schedule(delay=SHIPMENT_DELAY)  # saves it; NOTIFY on PostgreSQL
            out(f"  shipment #{shipment.pk} of order #{order.pk} to {address!r}: {shipment.status}")
        shipments = list(Shipment.objects.order_by("pk"))
        summary = enqueue(
            "reports",
            key="report-shipping",
            kind="report.shipping",
            after=shipments,  # rows as workflow parents
            on_parent_failure="run",
        )
        out(
            f"  {summary.message.key} after=[the {len(shipments)} shipment rows], "
            'on_parent_failure="run": once every\n  shipment is booked or has failed, it '
            "counts them (row_of(parent) reads each row)."
        )

        out(
            f"Seeded {Order.objects.count()} orders, {Message.objects.count()} messages and "
            f"{Shipment.objects.count()} shipments."
        )


def describe(result: EnqueueResult) -> str:
    """``orders/confirm-1 created`` (plus the delay for a future message)."""
    message = result.message
    text = f"{message.queue}/{message.key} {result.outcome.value}"
    if message.group:
        text += f" [group {message.group}]"
    delay = (message.next_attempt_time - message.created_at).total_seconds()
    if delay >= 0.5:
        text += f" (due in {delay:.0f} s)"
    return text
