"""A staff user without a page's permission cannot tell which ids exist.

Every admin URL of django-delayq's models that takes an object id is found
from the admin site's URL patterns (the operations with each operation's
name) and asked, with GET and POST, for an id that exists and one that does
not: where the existing id is refused (403), the missing one must be refused
the same way, not answered 404 or redirected with "does not exist".
"""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import URLPattern, reverse

from django_delayq.admin import actions
from django_delayq.models import Message, WorkerState
from tests.admin.staff import staff_client
from tests.factories import MessageFactory

pytestmark = pytest.mark.django_db

MISSING = 987654321


def id_urls() -> list[tuple[str, dict[str, str]]]:
    """``(url name, extra kwargs)`` of every per-object admin URL of the app's models."""
    found = []
    for model in (Message, WorkerState):
        for pattern in admin.site._registry[model].get_urls():
            if not isinstance(pattern, URLPattern) or not pattern.name:
                continue
            if "object_id" not in str(pattern.pattern):
                continue
            if "<str:name>" in str(pattern.pattern):
                found += [(pattern.name, {"name": n}) for n in sorted(actions.OPERATIONS)]
            else:
                found.append((pattern.name, {}))
    return found


def test_the_per_object_pages_are_found():
    names = {name for name, _ in id_urls()}
    assert {
        "django_delayq_message_change",
        "django_delayq_message_delete",
        "django_delayq_message_history",
        "django_delayq_message_edit_payload",
        "django_delayq_message_operation",
        "django_delayq_workerstate_history",
    } <= names


@pytest.mark.parametrize("permissions", [(), ("view_message",), ("view_workerstate",)])
def test_a_page_refused_for_an_existing_id_is_refused_for_a_missing_one(permissions):
    message = MessageFactory(status="failed")
    worker = WorkerState.objects.create(
        name="w", host="h", pid=1, started_at=message.created_at, last_seen=message.created_at
    )
    client, _ = staff_client("staff", *permissions)
    leaks = []
    for name, extra in id_urls():
        existing = message.pk if "message" in name else worker.pk
        for method in ("get", "post"):
            answers = {}
            for object_id in (existing, MISSING):
                url = reverse(f"admin:{name}", kwargs={"object_id": object_id, **extra})
                answers[object_id] = getattr(client, method)(url).status_code
            if answers[existing] == 403 and answers[MISSING] != 403:
                leaks.append((name, extra, method, answers[MISSING]))
    assert leaks == []
