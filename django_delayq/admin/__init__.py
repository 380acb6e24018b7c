"""The Django admin for the queue.

``messages.py``
    ``MessageAdmin``: the changelist (columns, filters, payload search, cheap
    counts), the change page (payload, error, timeline, operation buttons),
    and the hook for extra pages (``EXTRA_URLS`` / ``register_view``).
``display.py``, ``changelist.py``, ``filters.py``, ``payload.py``, ``forms.py``
    its parts: how a message is shown (the list's columns, the change page's
    read-only fields), the paginator and changelist classes, the list
    filters, the payload's JSON display and form field, and the change form.
``actions.py``
    the admin actions and their intermediate pages; each calls a function of
    ``django_delayq.operations``.
``dashboard.py``, ``triage.py``, ``schedules.py``, ``workflows.py``
    the queue dashboard (with pause/resume), the failures view grouped by
    error fingerprint, the cron schedules page, and a message's workflow
    drawn as a graph.
``workers.py``
    ``WorkerStateAdmin``: the workers and their heartbeats (read-only).
``entity.py``
    ``QueueAdminMixin``: the same filters and actions on the changelist of
    your own model with ``QueueFields``.

Other admin modules add their pages under the message changelist's URL by
appending to ``EXTRA_URLS`` (or calling ``register_view``) when imported;
import them at the end of this file so they are registered before the URLconf
is built.
"""

from __future__ import annotations

from django_delayq.admin.messages import (
    EXTRA_URLS,
    OBJECT_TOOLS,
    MessageAdmin,
    register_view,
)

__all__ = ["EXTRA_URLS", "OBJECT_TOOLS", "MessageAdmin", "QueueAdminMixin", "register_view"]

# Extra admin pages: import the modules that register them here.
from django_delayq.admin import (  # noqa: E402, F401
    dashboard,
    schedules,
    triage,
    workers,
    workflows,
)
from django_delayq.admin.entity import QueueAdminMixin  # noqa: E402
