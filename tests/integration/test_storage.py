"""Migration 0005: the message table's storage parameters on PostgreSQL."""

import pytest
from django.db import connection

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        "connection.vendor != 'postgresql'", reason="storage parameters are PostgreSQL's"
    ),
]


def test_message_table_vacuums_early_and_leaves_room_for_hot_updates():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reloptions FROM pg_class WHERE relname = %s", ["django_delayq_message"]
        )
        (options,) = cursor.fetchone()
    assert "fillfactor=80" in options
    assert "autovacuum_vacuum_scale_factor=0.01" in options
