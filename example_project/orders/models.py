from django.db import models
from django.utils import timezone

from django_delayq.entity import QueueFields


class Order(models.Model):
    class Status(models.TextChoices):
        NEW = "new", "new"
        CONFIRMED = "confirmed", "confirmed"
        SHIPPED = "shipped", "shipped"

    customer_email = models.EmailField()
    total = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.NEW)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"Order #{self.pk} ({self.customer_email}, {self.status})"


class Shipment(QueueFields):
    """A parcel to book with the carrier, for a confirmed order.

    The row is its own queue message: ``QueueFields`` adds the queue columns
    (status, next attempt, attempts, last error, lock) and the claim index,
    and ``orders/handlers.py`` registers ``book_shipment`` for this model,
    so ``run_delayq`` books due shipments with the same claim, lease and
    retry rules as messages. ``shipment.schedule()`` queues one.
    """

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="shipments")
    address = models.CharField(max_length=200)
    tracking_number = models.CharField(max_length=32, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta(QueueFields.Meta):
        ordering = ["id"]

    def __str__(self) -> str:
        return f"Shipment #{self.pk} of order #{self.order_id} ({self.status})"
