from django.db import models

from django_delayq.entity import QueueFields, claim_index


class Execution(models.Model):
    """One run of a test handler: what a worker did, for the suite to check."""

    message_id = models.BigIntegerField(db_index=True)
    attempt = models.PositiveIntegerField()
    worker = models.CharField(max_length=255, blank=True, default="")
    queue = models.CharField(max_length=100)
    started = models.DateTimeField()
    finished = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"message {self.message_id} attempt {self.attempt}"


class Effect(models.Model):
    """A business write made by an atomic handler (exactly-once checks)."""

    message_id = models.BigIntegerField()
    value = models.CharField(max_length=100, blank=True, default="")

    def __str__(self) -> str:
        return f"effect of message {self.message_id}"


class Sent(models.Model):
    """A producer's ledger: one row per enqueue, written in the enqueue's transaction.

    A row exists if and only if the transaction committed, so after a chaos
    run the ledger is the exact list of messages that must be processed.
    """

    producer = models.PositiveIntegerField()
    queue = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    outcome = models.CharField(max_length=16)
    delayed = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.queue}/{self.key} by producer {self.producer}"


class Shipment(QueueFields):
    """A row that is its own message (``QueueFields``): the entity tests' model.

    The handler (``handlers.ship``) fails attempts <= ``fail`` and sleeps
    ``sleep`` seconds, like the message handlers' payload knobs.
    """

    reference = models.CharField(max_length=50)
    priority = models.SmallIntegerField(default=0)
    fail = models.PositiveIntegerField(default=0)
    sleep = models.FloatField(default=0)
    shipped_at = models.DateTimeField(null=True, blank=True)

    class Meta(QueueFields.Meta):
        ordering = ["id"]
        # With a priority column the claim orders by it first: index that order.
        indexes = [claim_index("testapp_shipment_dq_claim", priority=True)]

    def __str__(self) -> str:
        return self.reference


class Operation(models.Model):
    """An operator's action of the adversary suite, from a process with a skewed clock.

    ``at`` is the real time just before the action, ``due`` the due time it set
    (a reschedule), ``changed`` how many rows it changed.
    """

    message_id = models.BigIntegerField(db_index=True)
    action = models.CharField(max_length=20)
    offset = models.FloatField(default=0)
    at = models.DateTimeField()
    due = models.DateTimeField(null=True)
    changed = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.action} of message {self.message_id}"


class Raised(models.Model):
    """A callback of the adversary suite that raised on purpose (``where``, ``exception``)."""

    message_id = models.BigIntegerField(db_index=True)
    where = models.CharField(max_length=20)
    exception = models.CharField(max_length=30)
    pid = models.IntegerField()

    def __str__(self) -> str:
        return f"{self.where} raised {self.exception} for message {self.message_id}"
