"""The admin renders in a real browser and needs a login."""

import pytest

from django_delayq import enqueue

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_login_is_required_then_the_message_list_shows_messages(page, live_server, admin_login):
    page.goto(f"{live_server.url}/admin/django_delayq/message/")
    assert "/admin/login/" in page.url
    enqueue("default", {"companyId": 3345}, key="browser-smoke")
    base = admin_login()
    page.goto(f"{base}django_delayq/message/")
    assert page.locator("#result_list").inner_text().count("browser-smoke") == 1
