from django.db import models


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
