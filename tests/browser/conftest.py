"""A real headless Chromium (Debian's) driven by Playwright against live_server.

The browser is the system's ``/usr/bin/chromium`` (``scripts/dev.sh test``
installs Debian's ``chromium`` package when it is missing); Playwright never
downloads one. Set ``DELAYQ_CHROMIUM`` to use another executable.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("DELAYQ_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parents[2] / "docs"

# Flags that keep Chromium from reaching out to the network on start-up: the
# machines this runs on may have none, and each refused connection is noise.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"no Chromium at {CHROMIUM}: install Debian's chromium package "
            "(scripts/dev.sh test does it) or set DELAYQ_CHROMIUM"
        )
    # Playwright's sync API runs an event loop in this thread; the ORM calls
    # the tests make around it are synchronous and safe.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # Playwright gives each launch a fresh, empty profile directory.
        instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})  # type: ignore[attr-defined]
    page = context.new_page()
    page.set_default_timeout(20_000)
    yield page
    context.close()


@pytest.fixture
def admin_login(page: object, live_server: object, django_user_model: object):
    """Log in through the real login form; returns the admin's base URL."""

    def login(username: str = "operator", password: str = "s3cret-pass") -> str:
        django_user_model.objects.create_superuser(username, f"{username}@example.com", password)  # type: ignore[attr-defined]
        base = f"{live_server.url}/admin/"  # type: ignore[attr-defined]
        page.goto(base)  # type: ignore[attr-defined]
        page.fill("#id_username", username)  # type: ignore[attr-defined]
        page.fill("#id_password", password)  # type: ignore[attr-defined]
        page.click("input[type=submit]")  # type: ignore[attr-defined]
        page.wait_for_selector("#site-name")  # type: ignore[attr-defined]
        return base

    return login
