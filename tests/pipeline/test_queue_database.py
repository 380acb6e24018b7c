"""``delayq_pipeline`` with the queue on its own database (DELAYQ_TEST_QUEUE_URL)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from django.conf import settings

from django_delayq.models import Message
from tests.pipeline.conftest import finished, run_pipeline

pytestmark = [
    pytest.mark.pipeline,
    pytest.mark.skipif(
        "queue" not in settings.DATABASES, reason="needs DELAYQ_TEST_QUEUE_URL (a second database)"
    ),
    pytest.mark.django_db(databases=["default", "queue"], transaction=True),
]

D1 = datetime(2024, 3, 1, 12, tzinfo=UTC)


def test_archive_and_report_read_the_queue_database(tmp_path: Path) -> None:
    for key in ("a", "b"):
        finished("mail", key, finished_at=D1, lag=1, processing=1)
    archive = str(tmp_path / "archive")
    summary, _ = run_pipeline(
        "archive", "--dest", archive, "--older-than", "0", "--database", "queue"
    )
    assert summary.deleted == 2
    assert not Message.objects.using("queue").exists()
    # And without --database: DELAYQ["DATABASE"] names it.
    finished("sms", "live", finished_at=D1, lag=1, processing=1)
    report, _ = run_pipeline(
        "report", "--source", archive, "--out", str(tmp_path / "r"), "--include-live"
    )
    assert [(f.queue, f.day, f.messages) for f in report.days] == [
        ("mail", date(2024, 3, 1), 2),
        ("sms", date(2024, 3, 1), 1),
    ]
