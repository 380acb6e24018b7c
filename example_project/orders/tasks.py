"""A task of Django's Tasks framework, run by django-delayq.

``TASKS`` in settings.py points Django at ``django_delayq.backends.DelayQBackend``,
so ``send_receipt.enqueue(order.pk)`` writes a message in the caller's
transaction (queue "emails", beside the messages of the ``send_email``
handler), ``manage.py run_delayq`` runs it, and ``send_receipt.get_result(id)``
reads its status and return value from that message.

Django 6 ships the framework (``django.tasks``); on Django 5.2 it is the
``django-tasks`` backport, with the same API.
"""

from __future__ import annotations

import logging
from typing import Any

from orders.models import Order

try:
    from django.tasks import task
except ImportError:  # Django 5.2
    from django_tasks import task  # type: ignore[no-redef]

logger = logging.getLogger("orders")


@task(queue_name="emails", priority=10)
def send_receipt(order_id: int) -> dict[str, Any]:
    """Email the receipt of an order; the return value is kept as the task's result."""
    order = Order.objects.get(pk=order_id)
    receipt = {"order_id": order.pk, "to": order.customer_email, "total": str(order.total)}
    logger.info("receipt for order #%s sent to %s", order.pk, order.customer_email)
    return receipt
