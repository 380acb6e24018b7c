"""Staff users with chosen permissions on messages, for the admin tests."""

from __future__ import annotations

from django.contrib.auth.models import Permission, User
from django.test import Client


def staff_client(username: str, *codenames: str) -> tuple[Client, User]:
    """A logged-in client of a staff user holding ``codenames`` on django_delayq."""
    user = User.objects.create_user(username, password="x", is_staff=True)
    if codenames:
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label="django_delayq", codename__in=codenames
            )
        )
    client = Client()
    client.force_login(user)
    return client, user
