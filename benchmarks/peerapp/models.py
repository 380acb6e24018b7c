from django.db import models


class Job(models.Model):
    """The queue table a team writes by hand for a select_for_update loop."""

    queue = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    run_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["queue", "run_at"], name="peer_job_claim")]

    def __str__(self) -> str:
        return f"{self.queue} {self.pk}"


class Sink(models.Model):
    """The one row the ``write`` handlers insert."""

    n = models.BigIntegerField()

    def __str__(self) -> str:
        return str(self.n)
