"""The statuses of a queued row: a ``Message``, or a row of a ``QueueFields`` model.

Kept apart from the models so that the data-access layer (``store/``), which
the models' managers come from, can name them without importing the models.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Status(models.TextChoices):
    PENDING = "pending", _("pending")  # waiting, scheduled, or waiting for a retry
    RUNNING = "running", _("running")  # claimed; next_attempt_time is the lease expiry
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")  # gave up
    CANCELLED = "cancelled", _("cancelled")


#: Rows that may still run: waiting, scheduled or leased.
ACTIVE = ("pending", "running")
#: Rows that are done; retention prunes them.
FINISHED = ("succeeded", "failed", "cancelled")
