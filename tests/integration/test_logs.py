"""The worker's log records carry message id, queue, key, kind and attempt as fields."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from pythonjsonlogger.json import JsonFormatter

from django_delayq import enqueue
from django_delayq.logs import FIELDS


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The ``django_delayq`` logger written as JSON lines, as a project would configure it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("%(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger("django_delayq")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(level)


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_formatter_writes_the_fields_of_every_outcome(delayq, json_log):
    ok = enqueue("default", {}, key="log-ok", kind="typed").message
    flaky = enqueue("default", {"fail": 1}, key="log-flaky").message
    bad = enqueue("default", {"discard": "no customer"}, key="log-bad").message
    snooze = enqueue("default", {"retry_in": 5}, key="log-snooze").message
    doomed = enqueue("other", {"fail": 9}, key="log-doomed").message  # max_attempts=2
    delayq.run_all()

    records = [r for r in lines(json_log) if "message_id" in r]
    by = {(r["message_id"], r["outcome"]): r for r in records}
    assert set(by) == {
        (ok.pk, "succeeded"),
        (flaky.pk, "retrying"),
        (flaky.pk, "succeeded"),
        (bad.pk, "discarded"),
        (snooze.pk, "snoozed"),
        (snooze.pk, "succeeded"),
        (doomed.pk, "retrying"),
        (doomed.pk, "failed"),
    }
    success = by[(ok.pk, "succeeded")]
    assert success["levelname"] == "DEBUG"
    assert (success["queue"], success["key"], success["kind"]) == ("default", "log-ok", "typed")
    assert success["attempt"] == 1 and success["duration"] >= 0
    assert by[(flaky.pk, "retrying")]["levelname"] == "WARNING"
    assert by[(flaky.pk, "retrying")]["attempt"] == 1
    assert by[(flaky.pk, "succeeded")]["attempt"] == 2
    failed = by[(doomed.pk, "failed")]
    assert (failed["levelname"], failed["queue"], failed["attempt"]) == ("ERROR", "other", 2)
    assert "log-doomed" in failed["message"]
    # The final failure carries the last attempt's traceback; a retry does not.
    assert failed["exc_info"].startswith("Traceback")
    assert "exc_info" not in by[(doomed.pk, "retrying")]
    assert by[(bad.pk, "discarded")]["levelname"] == "INFO"


def test_records_carry_the_fields_as_attributes(delayq, caplog):
    message = enqueue("default", {"fail": 1}, key="attr").message
    with caplog.at_level(logging.WARNING, logger="django_delayq"):
        delayq.run_pending("default")
    [record] = [r for r in caplog.records if getattr(r, "message_id", None) == message.pk]
    assert {name: getattr(record, name, None) for name in FIELDS[:5]} == {
        "message_id": message.pk,
        "queue": "default",
        "key": "attr",
        "kind": "",
        "attempt": 1,
    }
    assert record.outcome == "retrying"


def test_no_success_record_is_built_above_debug(delayq, caplog):
    enqueue("default", {}, key="quiet")
    with caplog.at_level(logging.INFO, logger="django_delayq"):
        delayq.run_pending("default")
    assert not [r for r in caplog.records if getattr(r, "outcome", None) == "succeeded"]


@pytest.mark.django_db(transaction=True)
def test_the_stop_line_counts_attempts_by_outcome(run_worker, fake_clock, caplog):
    enqueue("default", {}, key="stop-ok")
    enqueue("other", {"fail": 9}, key="stop-doomed")  # max_attempts=2
    with caplog.at_level(logging.INFO, logger="django_delayq"):
        run_worker(["default", "other"])
        fake_clock.advance(61)  # the suite's FixedDelay policy waits 60 s
        run_worker(["default", "other"])
    stops = [r.getMessage() for r in caplog.records if " stopped" in r.getMessage()]
    assert [line.split(" stopped")[1] for line in stops] == [
        "; attempts by outcome: retrying 1, succeeded 1",
        "; attempts by outcome: failed 1",
    ]


@pytest.mark.django_db(transaction=True)
def test_a_line_names_the_row_by_its_model_and_delays_read_as_durations(delayq, caplog):
    """A row of a project's queue model is not "message 5" (a Message of that id
    may be logged a moment later), every line says (queue/key), and a delay reads
    as one (``200ms``), not as a timedelta's ``0:00:00.200000``."""
    from tests.testapp.models import Shipment

    row = Shipment(reference="s", fail=1)
    row.schedule()
    snoozing = enqueue("default", {"retry_in": 2}, key="log-snooze-2").message
    flaky = enqueue("chaos", {"fail": 1}, key="log-flaky-2").message  # FixedDelay(0.2)
    with caplog.at_level(logging.INFO, logger="django_delayq"):
        delayq.run_pending("shipments")
        delayq.run_pending("default")
        delayq.run_pending("chaos")
    said = [r.getMessage() for r in caplog.records if hasattr(r, "message_id")]

    def line(start: str) -> str:
        [found] = [text for text in said if text.startswith(start)]
        return found

    assert line(f"testapp.shipment {row.pk} (shipments/{row.key}) attempt 1 failed, retrying in ")
    assert line(f"message {snoozing.pk} ") == (
        f"message {snoozing.pk} (default/log-snooze-2) snoozed for 2.0s: asked to"
    )
    assert line(f"message {flaky.pk} (chaos/log-flaky-2) attempt 1 failed, retrying in 200ms: ")
