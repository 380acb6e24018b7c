"""The suite behind a pooler: DATABASE_URL through PgBouncer in transaction mode,
DELAYQ_TEST_DIRECT_URL the same server without it (alias "direct").

``scripts/dev.sh`` runs the core suite so; tests that need a session of
their own (a LISTEN, ``pg_terminate_backend`` of a known backend) take it
from :func:`direct_connect`, or skip through the pooler with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import connections


def behind_pooler() -> bool:
    return "direct" in settings.DATABASES


def session_alias() -> str:
    """The alias whose connections are real sessions: "direct" behind a pooler."""
    return "direct" if behind_pooler() else "default"


def direct_connect(**kwargs: Any) -> Any:
    """A psycopg connection to the test database that no pooler stands between."""
    import psycopg

    params = {
        k: v
        for k, v in connections[session_alias()].get_connection_params().items()
        if k not in ("cursor_factory", "context", "server_side_binding")
    }
    return psycopg.connect(**params, **kwargs)


def skip_behind_pooler(reason: str) -> None:
    if behind_pooler():
        pytest.skip(f"through a pooler in transaction mode: {reason}")


def end_pooled_sessions() -> None:
    """Terminate the other backends of the test database (the pooler's server
    connections), so that it can be dropped at the end of the run."""
    with direct_connect(autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
