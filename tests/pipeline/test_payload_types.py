"""Payloads loaded by the pipeline come back as ``enqueue`` would store them: the same
types (floats stay floats on PostgreSQL), the same depth limit, the same refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError

from django_delayq.models import Message
from django_delayq.payload import MAX_PAYLOAD_DEPTH
from tests.json_values import exact
from tests.pipeline.conftest import run_pipeline, write_frame

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]


def payloads(queue: str) -> dict[str, Any]:
    return {m.key: exact(m.payload) for m in Message.objects.filter(queue=queue)}


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        run_pipeline(*args)
    assert caught.value.returncode == 2
    return str(caught.value)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_json_lines_keep_their_types_beside_ragged_rows(tmp_path: Path) -> None:
    """Spark's schema inference made ``[[1]]`` ``[["1"]]`` beside a deeper array."""
    rows = [
        {"id": "a", "deep": [[1]], "v": 1, "f": 1.0},
        {"id": "b", "deep": [[[2, "x"]]], "v": "1", "f": 1e16},
        {"id": "c", "deep": {"k": [True]}, "v": None, "f": 5e-324},
        {"id": "d", "v": 2**40},
    ]
    source = tmp_path / "ragged.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    summary, _ = run_pipeline("enqueue", str(source), "--queue", "ragged", "--key-column", "id")
    assert (summary.created, summary.rejected) == (4, 0)
    expected = {r["id"]: {"deep": None, "f": None, **r} for r in rows}
    assert payloads("ragged") == {k: exact(v) for k, v in expected.items()}


def test_json_lines_are_checked_as_enqueue_checks_a_payload(tmp_path: Path) -> None:
    lines = [
        '{"id": "ok", "v": [1.5]}',
        '{"id": "zero", "v": -0.0}',
        '{"id": "surrogate", "v": "\\ud800"}',
        '{"id": "deep", "v": ' + json.dumps(nested(MAX_PAYLOAD_DEPTH)) + "}",
        '{"id": "bad", "v": ',
        '["not", "an", "object"]',
    ] + [f'{{"id": "fill{i}", "v": {i}}}' for i in range(14)]
    source = tmp_path / "checked.jsonl"
    source.write_text("\n".join(lines) + "\n")
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "checked", "--key-column", "id",
        "--max-reject-rate", "0.5",
    )  # fmt: skip
    assert (summary.created, summary.rejected) == (15, 5)
    assert exact(Message.objects.get(queue="checked", key="ok").payload) == exact(
        {"id": "ok", "v": [1.5]}
    )
    text = Path(str(summary.rejects_path)).read_text()
    reasons = [json.loads(line)["reason"] for line in text.splitlines()]
    assert any("payload['v'] is -0.0" in r for r in reasons), reasons
    assert any("payload['v'] contains a lone surrogate" in r for r in reasons), reasons
    assert any("deeper than MAX_PAYLOAD_DEPTH (20" in r for r in reasons), reasons
    assert sum(r.startswith("malformed JSON line") for r in reasons) == 2, reasons


def test_parquet_floats_come_back_floats(spark: Any, tmp_path: Path) -> None:
    """``to_json`` writes 1.0E16; jsonb kept the digits and gave back an int."""
    numbers = [1e16, 1e308, 5e-324, 1e7, 0.001, 1.0, 123456789.0, -2.5e-300, 0.0]
    rows = [(str(i), x, [x], {"x": x}) for i, x in enumerate(numbers)]
    schema = "id string, x double, xs array<double>, m map<string,double>"
    source = write_frame(spark, tmp_path / "f.parquet", rows, schema)
    summary, _ = run_pipeline("enqueue", str(source), "--queue", "floats", "--key-column", "id")
    assert summary.created == len(numbers)
    assert payloads("floats") == {
        str(i): exact({"id": str(i), "x": x, "xs": [x], "m": {"x": x}})
        for i, x in enumerate(numbers)
    }


def test_parquet_negative_zero_is_a_rejected_row(spark: Any, tmp_path: Path) -> None:
    rows = [(str(i), float(i)) for i in range(9)] + [("z", -0.0)]
    source = write_frame(spark, tmp_path / "z.parquet", rows, "id string, x double")
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "zero", "--key-column", "id", "--max-reject-rate", "0.2"
    )
    assert (summary.created, summary.rejected) == (9, 1)
    assert not Message.objects.filter(key="z").exists()


@pytest.mark.parametrize("depth", [MAX_PAYLOAD_DEPTH, 31, 36])
def test_a_parquet_column_nested_past_the_limit_is_refused_before_writing(
    spark: Any, tmp_path: Path, depth: int
) -> None:
    """MariaDB refused 32 levels and more, and INSERT IGNORE counted the rows as there
    already ("created 0, updated 0, ignored 2", exit status 0)."""
    schema = "id int, deep " + "array<" * depth + "int" + ">" * depth
    source = write_frame(
        spark, tmp_path / "deep.parquet", [(1, nested(depth)), (2, nested(depth))], schema
    )
    message = refused("enqueue", str(source), "--queue", "deep")
    assert message.startswith("payload column 'deep' has type array<array<")
    assert f"nests {depth + 1} levels of arrays and objects, over MAX_PAYLOAD_DEPTH (20)" in message
    assert not Message.objects.exists()
    # One level less fits: the payload is the object of the columns.
    shallower = (
        "id int, deep " + "array<" * (MAX_PAYLOAD_DEPTH - 1) + "int" + ">" * (MAX_PAYLOAD_DEPTH - 1)
    )
    value = nested(MAX_PAYLOAD_DEPTH - 1)
    fits = write_frame(spark, tmp_path / "fits.parquet", [(1, value), (2, value)], shallower)
    summary, _ = run_pipeline("enqueue", str(fits), "--queue", "deep", "--key-column", "id")
    assert summary.created == 2
    assert payloads("deep") == {
        "1": exact({"id": 1, "deep": value}),
        "2": exact({"id": 2, "deep": value}),
    }
