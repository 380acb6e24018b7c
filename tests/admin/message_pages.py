"""Helpers for the message admin tests: URLs, posting actions, reading the page."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.contrib.admin import helpers
from django.contrib.messages import get_messages
from django.urls import reverse

from tests.factories import MessageFactory

CHANGELIST = "/admin/django_delayq/message/"


def change_url(pk: int) -> str:
    return reverse("admin:django_delayq_message_change", args=[pk])


def operation_url(pk: int, name: str) -> str:
    return reverse("admin:django_delayq_message_operation", args=[pk, name])


def listed(response) -> list[int]:
    """Ids of the messages on the changelist page."""
    return [m.pk for m in response.context["cl"].result_list]


def notes(response) -> list[str]:
    """The messages (``message_user``) added while handling the request."""
    return [str(m) for m in get_messages(response.wsgi_request)]


def action_data(action: str, ids, *, select_across: bool = False, **extra) -> dict:
    """What the changelist's action bar posts (the first POST)."""
    return {
        "action": action,
        helpers.ACTION_CHECKBOX_NAME: [str(i) for i in ids],
        "select_across": "1" if select_across else "0",
        "index": "0",
        **extra,
    }


def confirm_data(action: str, ids, *, select_across: bool = False, **extra) -> dict:
    """What the intermediate page re-posts (the second POST)."""
    return {
        "action": action,
        helpers.ACTION_CHECKBOX_NAME: [str(i) for i in ids],
        "select_across": "1" if select_across else "0",
        "post": "yes",
        **extra,
    }


def one_of_each(now) -> dict:
    """One message per state the admin tells apart."""
    return {
        "pending_due": MessageFactory(
            key="pending-due", queue="emails", next_attempt_time=now - timedelta(hours=2)
        ),
        "pending_later": MessageFactory(
            key="pending-later", queue="emails", next_attempt_time=now + timedelta(minutes=5)
        ),
        "running": MessageFactory(
            key="running",
            queue="orders",
            status="running",
            next_attempt_time=now + timedelta(seconds=40),
            lock_token=uuid.uuid4(),
            locked_by="web-1:4242",
            attempt_count=1,
        ),
        "failed": MessageFactory(
            key="failed",
            queue="orders",
            status="failed",
            next_attempt_time=None,
            finished_at=now,
            attempt_count=5,
            last_error="app.Boom: card declined\nsecond line",
            last_traceback=(
                'Traceback (most recent call last):\n  File "x.py"\napp.Boom: card declined'
            ),
        ),
        "succeeded": MessageFactory(
            key="succeeded", status="succeeded", next_attempt_time=None, finished_at=now
        ),
    }
