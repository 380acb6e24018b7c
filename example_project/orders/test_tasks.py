"""The receipt task (orders/tasks.py), a Django task run by django-delayq.

``send_receipt.enqueue()`` writes a message; ``delayq.run_pending`` runs it
here, in this test's transaction, as ``run_delayq`` would; ``get_result``
reads the outcome back. Run with ``.venv/bin/pytest example_project``.
"""

from __future__ import annotations

import pytest

from orders.models import Order
from orders.tasks import send_receipt

pytestmark = pytest.mark.django_db


def test_the_receipt_task_runs_on_the_emails_queue_and_keeps_its_result(delayq):
    order = Order.objects.create(customer_email="ann@example.com", total="42.50")

    result = send_receipt.enqueue(order.pk)
    assert result.status == "READY"

    [attempt] = delayq.run_pending("emails")
    assert attempt.result == "succeeded"
    done = send_receipt.get_result(result.id)
    assert done.status == "SUCCESSFUL"
    assert done.return_value == {"order_id": order.pk, "to": "ann@example.com", "total": "42.50"}


def test_a_receipt_for_a_missing_order_fails_with_the_exception(delayq):
    result = send_receipt.enqueue(999_999)

    [attempt] = delayq.run_pending("emails")

    failed = send_receipt.get_result(result.id)
    assert (attempt.result, failed.status) == ("failed", "FAILED")
    assert failed.errors[0].exception_class_path == "orders.models.Order.DoesNotExist"
    assert "Order matching query does not exist" in failed.errors[0].traceback
