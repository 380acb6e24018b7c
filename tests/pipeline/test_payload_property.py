"""The payload round trip through the Spark loader, as a property (see
``tests/integration/test_payload_property.py``): each example is one batch of
generated payloads, loaded as one JSON-lines file (``{"id": ..., "v": payload}``,
ragged on purpose), beside values outside the limits, which must be rejected
rows whose reason names what is wrong. Few examples: Spark is slow (the
``thorough`` profile runs 20 batches of up to 300 payloads), and a failing
one is not shrunk (``spark_examples``), so the assertions name what went wrong.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from django_delayq.models import Message
from django_delayq.payload import MAX_PAYLOAD_DEPTH
from tests.json_values import exact
from tests.payload_strategies import FLOATS, OUTSIDE, json_values, spark_examples
from tests.pipeline.conftest import run_pipeline, write_frame

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

_runs = itertools.count()


def _json_text(value: Any) -> str | None:
    """The JSON text of a value outside the limits, if JSON text can carry it at all."""
    try:
        return json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        return None


@spark_examples(0.002, least=3)
# Found by this property: an object whose only key is "" (Spark's inference
# dropped the column); a rejects line holding U+0085 (cut by splitlines()).
@hypothesis.example(good=[{"": 0}, None], bad=[])
@hypothesis.example(good=[None], bad=[([{"\x85": None}, math.nan], "which JSON cannot hold")])
@hypothesis.given(
    # The line is an object around the payload: one level less for the payload.
    good=st.lists(json_values(MAX_PAYLOAD_DEPTH - 1), min_size=1, max_size=300),
    bad=st.lists(OUTSIDE, max_size=10),
)
def test_the_loader_gives_back_any_payload_within_the_limits(tmp_path: Path, good, bad):
    run = next(_runs)
    queue = f"prop{run}"
    lines = [json.dumps({"id": f"g{i}", "v": v}) for i, v in enumerate(good)]
    refused = []
    for i, (value, named) in enumerate(bad):
        text = _json_text(value)
        if text is None or "keys must be strings" in named:
            continue  # no JSON text holds it, or its text is a valid payload
        # A value nested past the limit makes its line one level deeper still.
        lines.append(f'{{"id": "b{i}", "v": {text}}}')
        refused.append(named)
    source = tmp_path / f"batch{run}.jsonl"
    source.write_text("\n".join(lines) + "\n")
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", queue, "--key-column", "id",
        "--payload-columns", "v", "--max-reject-rate", "0.99",
        "--rejects", str(tmp_path / f"_rejects{run}.jsonl"),
    )  # fmt: skip
    records = []
    if summary.rejects_path:
        text = Path(summary.rejects_path).read_text(encoding="utf-8")
        records = [json.loads(line) for line in text.splitlines()]
    # Unshrunk examples are long: name the payloads that went wrong, not the whole batch.
    lost = {
        r["row"]["id"]: (good[int(r["row"]["id"][1:])], r["reason"])
        for r in records
        if isinstance(r["row"], dict) and str(r["row"].get("id")).startswith("g")
    }
    assert not lost, lost
    got = {m.key: exact(m.payload) for m in Message.objects.filter(queue=queue)}
    want = {f"g{i}": exact({"v": v}) for i, v in enumerate(good)}
    assert not {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    assert got == want
    assert (summary.created, summary.rejected) == (len(good), len(refused))
    reasons = sorted(r["reason"] for r in records)
    for named in refused:
        assert any(named in r or (named == "NUL" and "NUL" in r) for r in reasons), (
            named,
            reasons,
        )


@spark_examples(0.002, least=3)
@hypothesis.given(numbers=st.lists(FLOATS, min_size=1, max_size=300))
def test_the_loader_gives_back_any_float_of_a_parquet_column(spark: Any, tmp_path: Path, numbers):
    """Parquet goes through Spark's own JSON (``to_json``), not the line's text."""
    run = next(_runs)
    queue = f"floats{run}"
    rows = [(f"k{i}", x, [x]) for i, x in enumerate(numbers)]
    source = write_frame(
        spark, tmp_path / f"f{run}.parquet", rows, "id string, x double, xs array<double>"
    )
    summary, _ = run_pipeline("enqueue", str(source), "--queue", queue, "--key-column", "id")
    assert summary.created == len(numbers)
    got = {m.key: exact(m.payload) for m in Message.objects.filter(queue=queue)}
    assert got == {
        f"k{i}": exact({"id": f"k{i}", "x": x, "xs": [x]}) for i, x in enumerate(numbers)
    }
