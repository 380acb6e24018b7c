"""``delayq_pipeline report``: figures checked against a small case computed by hand."""

from __future__ import annotations

import json
import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from django_delayq.fingerprint import fingerprint
from tests.pipeline.conftest import finished, run_pipeline

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

D1 = datetime(2024, 3, 1, 12, tzinfo=UTC)
D2 = datetime(2024, 3, 2, 12, tzinfo=UTC)


def hand_computed_case() -> None:
    """Lag = first start - scheduled (runs with one attempt only); processing = finish - start.

    mail, 2024-03-01: 6 messages, 3 succeeded / 2 failed / 1 cancelled
        lags of the single-attempt runs: 1, 2, 3, 10 s -> nearest rank p50 = 2nd = 2,
        p95 = p99 = 4th = 10; processing 0.5, 1, 1.5, 2, 4 -> p50 = 3rd = 1.5, p95 = 4
        attempts 1, 1, 1, 1, 3, 0 -> buckets 0:1 1:4 3:1, mean 7/6
    mail, 2024-03-02: 2 succeeded; lag 5 (one sample); processing 3, 1 -> p50 1, p95 3
    sms, 2024-03-01: 1 succeeded; lag 0.25, processing 0.1
    mail over both days: lags 1, 2, 3, 5, 10 -> p50 = 3, p95 = 10
    errors of mail: "ValueError: bad id <n>" twice (both failed), "KeyError: 'user_id'" once
    """
    t = timedelta(seconds=1)
    finished("mail", "s1", finished_at=D1, lag=1, processing=0.5)
    finished("mail", "s2", finished_at=D1 + t, lag=2, processing=1)
    finished("mail", "s3", finished_at=D1 + 2 * t, lag=3, processing=1.5)
    finished(
        "mail", "f1", status="failed", finished_at=D1 + 3 * t, lag=10, processing=2,
        error="ValueError: bad id 17\nTraceback...",
    )  # fmt: skip
    finished(
        "mail", "f2", status="failed", finished_at=D1 + 4 * t, lag=60, processing=4, attempts=3,
        error="ValueError: bad id 99", stored_fingerprint=False,
    )  # fmt: skip
    finished("mail", "c1", status="cancelled", finished_at=D1 + 5 * t, attempts=0)
    finished("mail", "s4", finished_at=D2, lag=5, processing=3)
    finished(
        "mail", "s5", finished_at=D2 + t, lag=30, processing=1, attempts=2,
        error="KeyError: 'user_id'",
    )  # fmt: skip
    finished("sms", "s6", finished_at=D1, lag=0.25, processing=0.1)


def test_report_figures_match_a_hand_computed_case(tmp_path: Path) -> None:
    hand_computed_case()
    archive = str(tmp_path / "archive")
    run_pipeline("archive", "--dest", archive, "--older-than", "0")
    out = tmp_path / "report"

    report, output = run_pipeline("report", "--source", archive, "--out", str(out))

    assert report.rows == 9
    days = {(f.queue, f.day): f for f in report.days}
    assert set(days) == {("mail", date(2024, 3, 1)), ("mail", date(2024, 3, 2)), ("sms", D1.date())}
    d1 = days["mail", date(2024, 3, 1)]
    assert (d1.messages, d1.succeeded, d1.failed, d1.cancelled) == (6, 3, 2, 1)
    assert d1.rate("failed") == pytest.approx(2 / 6)
    assert d1.attempts == {"0": 1, "1": 4, "2": 0, "3": 1, "4": 0, "5+": 0}
    assert (d1.attempts_mean, d1.attempts_max) == (pytest.approx(7 / 6), 3)
    assert (d1.lag, d1.lag_samples) == ((2.0, 10.0, 10.0), 4)
    assert (d1.processing, d1.processing_samples) == ((1.5, 4.0, 4.0), 5)
    bad_id = fingerprint("ValueError: bad id 1")
    assert d1.top_errors == [(bad_id, 2)]
    d2 = days["mail", date(2024, 3, 2)]
    assert (d2.messages, d2.succeeded, d2.lag, d2.processing) == (2, 2, (5.0,) * 3, (1.0, 3.0, 3.0))
    sms = days["sms", D1.date()]
    assert (sms.lag, sms.processing) == ((0.25,) * 3, (0.1,) * 3)
    mail = next(q for q in report.queues if q.queue == "mail")
    assert (mail.messages, mail.lag) == (8, (3.0, 10.0, 10.0))

    errors = [(e.queue, e.count, e.failed, e.error) for e in report.errors]
    assert errors == [
        ("mail", 2, 2, "ValueError: bad id <n>"),
        ("mail", 1, 0, "KeyError: 'user_id'"),
    ]

    # The terminal table, the JSON figures, the page and its charts.
    assert "lag p50" in output and "ValueError: bad id <n>" in output
    mail_d1 = next(
        line for line in output.splitlines() if line.split()[:2] == ["mail", "2024-03-01"]
    )
    assert mail_d1.split()[2:6] == ["6", "50.0%", "33.3%", "16.7%"]
    figures = json.loads((out / "report.json").read_text())
    assert figures["rows"] == 9 and len(figures["days"]) == 3
    page = (out / "report.html").read_text()
    assert "ValueError: bad id &lt;n&gt;" in page and 'src="lag.png"' in page
    for chart in ("lag.png", "throughput.png"):
        assert (out / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_since_and_live_messages(tmp_path: Path) -> None:
    hand_computed_case()
    archive = str(tmp_path / "archive")
    run_pipeline("archive", "--dest", archive, "--older-than", "0")
    finished("sms", "live", finished_at=D2, lag=1, processing=1)  # not archived yet

    report, _ = run_pipeline(
        "report", "--source", archive, "--out", str(tmp_path / "r"), "--since", "2024-03-02",
        "--include-live",
    )  # fmt: skip
    assert [(f.queue, f.day, f.messages) for f in report.days] == [
        ("mail", date(2024, 3, 2), 2),
        ("sms", date(2024, 3, 2), 1),
    ]


def test_report_files_never_follow_planted_links_and_are_private(tmp_path: Path) -> None:
    finished("mail", "s1", finished_at=D1, lag=1, processing=0.5)
    archive = str(tmp_path / "archive")
    run_pipeline("archive", "--dest", archive, "--older-than", "0")
    out = tmp_path / "report"
    out.mkdir()
    names = ("report.json", "report.html", "lag.png", "throughput.png")
    victims = {}
    for name in names:
        victim = tmp_path / f"victim-{name}.txt"
        victim.write_text("precious")
        (out / name).symlink_to(victim)
        victims[name] = victim

    previous = os.umask(0o022)
    try:
        run_pipeline("report", "--source", archive, "--out", str(out))
    finally:
        os.umask(previous)

    for name in names:
        assert victims[name].read_text() == "precious", name
        written = out / name
        assert not written.is_symlink() and written.is_file(), name
        assert written.stat().st_mode & 0o777 == 0o600, name
    assert json.loads((out / "report.json").read_text())["rows"] == 1
    # Nothing left behind but the report.
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    # A new --out directory is private too.
    fresh = tmp_path / "fresh" / "report"
    run_pipeline("report", "--source", archive, "--out", str(fresh))
    assert fresh.stat().st_mode & 0o777 == 0o700
