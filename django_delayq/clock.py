"""The one place the library reads the time.

Due times and leases are compared against this clock; keeping it behind a
function gives tests (and the user-facing testing helpers) a single seam to
move time forward without sleeping.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone


def now() -> datetime:
    return timezone.now()
