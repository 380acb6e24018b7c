"""JSON lines whose keys Spark's schema inference mishandles load as ``enqueue`` stores them.

Each line's payload and columns come from the line's own text: Spark
dropped a column whose objects had no key but ``""`` (``{"": 0}``, ``{}``),
stopped the whole run at keys that differ only in case (``{"a": 1, "A":
2}``) or repeat, and read a column named ``a.b`` or holding a backtick as a
path, or not at all. A line whose value no JSON object of ``enqueue`` can
hold (a repeated key, a key that is an object) is a rejected row, with why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from django_delayq.models import Message
from tests.json_values import exact
from tests.pipeline.conftest import run_pipeline, write_csv, write_frame

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]


def write_lines(path: Path, rows: list[Any]) -> Path:
    """One line per row: a dict is written as JSON, a str as it is."""
    text = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def payloads(queue: str) -> dict[str, Any]:
    return {m.key: exact(m.payload) for m in Message.objects.filter(queue=queue)}


def rejects(summary: Any) -> list[dict[str, Any]]:
    text = Path(str(summary.rejects_path)).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def every_column(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each row's expected payload, keyed by ``id``: every column of the file, null where absent."""
    names = {n for row in rows for n in row}
    return {row["id"]: exact({n: row.get(n) for n in names}) for row in rows}


# Objects whose only keys are "" (or none): Spark's inference drops such a field.
EMPTY_KEYED = [{"": 0}, {}, [{}], [{"": 1}], {"a": {"": None}}, {"": {"": []}}, None]


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([{"": 0}, None], id="the-falsifying-example"),
        pytest.param([{"": 0}, {}, {"a": {"": None}}, {"": {"": []}}, None], id="objects"),
        pytest.param([[{}], [{"": 1}], [], None], id="arrays"),
    ],
)
def test_a_payload_column_whose_objects_have_only_empty_keys_is_a_column(
    tmp_path: Path, values: list[Any]
) -> None:
    """``PipelineError: payload column 'v' is not a column of ... (columns: id)``: each
    file's ``v`` inferred as nothing (an object beside an array is text, kept)."""
    rows = [{"id": f"g{i}", "v": v} for i, v in enumerate(values)]
    source = write_lines(tmp_path / "empty.jsonl", rows)
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "empty", "--key-column", "id", "--payload-columns", "v"
    )
    assert (summary.created, summary.rejected) == (len(rows), 0)
    assert payloads("empty") == {r["id"]: exact({"v": r["v"]}) for r in rows}


def test_every_column_includes_one_whose_objects_have_only_empty_keys(tmp_path: Path) -> None:
    """Without ``--payload-columns`` the payload silently lost the column ``w`` (and ``""``)."""
    rows = [{"id": f"g{i}", "w": v, "": i} for i, v in enumerate(EMPTY_KEYED)]
    source = write_lines(tmp_path / "every.jsonl", rows)
    summary, _ = run_pipeline("enqueue", str(source), "--queue", "every", "--key-column", "id")
    assert (summary.created, summary.rejected) == (len(rows), 0)
    assert payloads("every") == every_column(rows)


def test_keys_that_differ_only_in_case_load_as_given(tmp_path: Path) -> None:
    """Spark stopped the whole run: ``[COLUMN_ALREADY_EXISTS] The column `a` already exists``."""
    rows = [
        {"id": "g0", "v": {"a": 1, "A": 2}},
        {"id": "g1", "v": [{"ǅ": 1, "ǆ": 2, "Ǆ": 3}, {"ß": 4, "SS": 5, "ss": 6}]},
        {"id": "g2", "v": {"k": {"x": True, "X": False}}},
        {"id": "g3", "v": 3, "V": 4},
        {"id": "g4", "ID": "not the key", "v": 5},
        {"id": "g5", "v": {"a": 1}},
        {"id": "g6", "v": {"A": 2}},
    ]
    source = write_lines(tmp_path / "case.jsonl", rows)
    summary, _ = run_pipeline("enqueue", str(source), "--queue", "case", "--key-column", "id")
    assert (summary.created, summary.rejected) == (len(rows), 0)
    assert payloads("case") == every_column(rows)

    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "case_v", "--key-column", "ID", "--payload-columns",
        "v,V", "--max-reject-rate", "1",
    )  # fmt: skip
    assert (summary.created, summary.rejected) == (1, len(rows) - 1)
    assert payloads("case_v") == {"not the key": exact({"v": 5, "V": None})}


def test_nested_keys_with_dots_backticks_and_brackets_load_as_given(tmp_path: Path) -> None:
    rows = [
        {"id": "g0", "v": {"a.b": 1, "a": {"b": 2}, "c`d": 3, "`": 4, "[0]": 5, "$.x": 6}},
        {"id": "g1", "v": {" ": 1, "a b": 2, "'q'": 3, '"': 4, "\\": 5, "\u2028": 6}},
        {"id": "g2", "v": {"_corrupt_record": 1, "_delayq_line": 2, "\x85": 3}},
    ]
    source = write_lines(tmp_path / "nested.jsonl", rows)
    summary, _ = run_pipeline("enqueue", str(source), "--queue", "nested", "--key-column", "id")
    assert (summary.created, summary.rejected) == (len(rows), 0)
    assert payloads("nested") == every_column(rows)


def test_columns_named_with_dots_backticks_or_the_loaders_own_names(tmp_path: Path) -> None:
    """``a.b`` was read as the field ``b`` of ``a`` (another value as the key) or not at all,
    a backtick stopped the run (``INVALID_ATTRIBUTE_NAME_SYNTAX``), and ``""`` and
    ``_corrupt_record`` were silently left out of the payload."""
    rows = [
        {
            "a.b": f"k{i}",
            "a": {"b": f"not the key {i}"},
            "c`d": "team`1",
            "": i,
            "_corrupt_record": i,
            "_delayq_line": [i],
            "_row": {"n": i},
        }
        for i in range(3)
    ]
    source = write_lines(tmp_path / "names.jsonl", rows)
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "names", "--key-column", "a.b", "--group-column", "c`d"
    )
    assert (summary.created, summary.rejected) == (3, 0)
    assert payloads("names") == {r["a.b"]: exact(r) for r in rows}
    assert set(Message.objects.values_list("group", flat=True)) == {"team`1"}


def test_csv_columns_named_with_dots_or_backticks(tmp_path: Path) -> None:
    """The same names as CSV columns: the run stopped (``cannot resolve `a`.`b```)."""
    source = write_csv(
        tmp_path / "names.csv", ["a.b", "c`d", "n"], [["k1", "g`1", 1], ["k2", "", 2]]
    )
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "csv", "--key-column", "a.b", "--group-column", "c`d"
    )
    assert (summary.created, summary.rejected) == (2, 0)
    assert payloads("csv") == {
        "k1": exact({"a.b": "k1", "c`d": "g`1", "n": 1}),
        "k2": exact({"a.b": "k2", "c`d": None, "n": 2}),
    }
    assert dict(Message.objects.values_list("key", "group")) == {"k1": "g`1", "k2": ""}


def test_a_parquet_column_named_with_a_dot_is_not_read_as_a_path(
    spark: Any, tmp_path: Path
) -> None:
    """``--key-column a.b`` keyed each row by the field ``b`` of the column ``a``."""
    rows = [("k1", ("other1",), 1), ("k2", ("other2",), 2)]
    source = write_frame(
        spark, tmp_path / "dots.parquet", rows, "`a.b` string, a struct<b: string>, n int"
    )
    summary, _ = run_pipeline("enqueue", str(source), "--queue", "pq", "--key-column", "a.b")
    assert (summary.created, summary.rejected) == (2, 0)
    assert payloads("pq") == {
        "k1": exact({"a.b": "k1", "a": {"b": "other1"}, "n": 1}),
        "k2": exact({"a.b": "k2", "a": {"b": "other2"}, "n": 2}),
    }


def test_a_line_that_repeats_a_key_is_a_rejected_row(tmp_path: Path) -> None:
    """Spark stopped the whole run (``COLUMN_ALREADY_EXISTS``); which value a repeated key
    has is a guess, so the line is refused, not loaded with one of its values."""
    lines = [
        '{"id": "r0", "v": {"a": 1, "a": 2}}',
        '{"id": "r1", "v": [{"x": {"": 1, "": 1}}]}',
        '{"id": "r2", "id": "r3", "v": 1}',
        *(json.dumps({"id": f"g{i}", "v": {"a": i}}) for i in range(7)),
    ]
    source = write_lines(tmp_path / "repeated.jsonl", lines)
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "rep", "--key-column", "id", "--max-reject-rate", "0.5"
    )
    assert (summary.created, summary.rejected) == (7, 3)
    assert payloads("rep") == {f"g{i}": exact({"id": f"g{i}", "v": {"a": i}}) for i in range(7)}
    found = sorted((r["reason"], r["row"]) for r in rejects(summary))
    assert found == sorted(
        [
            ("the line repeats the key 'a' in one object", {"id": "r0", "v": {"a": 2}}),
            ("the line repeats the key '' in one object", {"id": "r1", "v": [{"x": {"": 1}}]}),
            ("the line repeats the key 'id' in one object", {"id": "r3", "v": 1}),
        ]
    )


def test_keyless_lines_are_keyed_by_their_own_values(tmp_path: Path) -> None:
    """The key of a row without ``--key-column`` hashed Spark's view of it, where a column
    holding ``1`` and ``"1"`` is text: the two rows were one message."""
    rows = [{"a": 1}, {"a": "1"}, {"a": 1.0}, {"a": True}, {"a": [1]}, {"a": 1, "b": None}]
    source = write_lines(tmp_path / "keyless.jsonl", rows)
    summary, _ = run_pipeline("enqueue", str(source), "--queue", "keyless")
    # {"a": 1} and {"a": 1, "b": null} are the same row: every column, b null.
    assert (summary.rows, summary.created, summary.ignored) == (6, 5, 1)
    got = sorted(exact(m.payload) for m in Message.objects.filter(queue="keyless"))
    assert got == sorted(exact({"a": r["a"], "b": None}) for r in rows[:5])


def test_a_key_group_or_run_at_of_another_json_type_is_a_rejected_row(tmp_path: Path) -> None:
    """A key that is an object became its JSON text; a number as the run-at stopped the run
    (``has type bigint``) or, beside text, was read as a year; a line's numeric key was
    written as a float (``"1.0"``) when another line's was one."""
    due = "2030-01-02T03:04:05Z"
    rows = [
        {"id": 1, "at": due, "g": "x"},
        {"id": 2.5, "at": due, "g": 7},
        {"id": True, "at": due, "g": None},
        {"id": {"k": 1}, "at": due, "g": "x"},
        {"id": "arr", "at": due, "g": ["x"]},
        {"id": "num", "at": 2024, "g": "x"},
        {"id": "flag", "at": False, "g": "x"},
        {"id": "obj", "at": {"t": due}, "g": "x"},
        *({"id": f"k{i}", "at": due, "g": "x"} for i in range(8)),
    ]
    source = write_lines(tmp_path / "types.jsonl", rows)
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "types", "--key-column", "id", "--run-at-column", "at",
        "--group-column", "g", "--max-reject-rate", "0.5",
    )  # fmt: skip
    assert (summary.created, summary.rejected) == (11, 5)
    assert set(Message.objects.values_list("key", "group")) == {
        ("1", "x"),
        ("2.5", "7"),
        ("true", ""),
        *((f"k{i}", "x") for i in range(8)),
    }
    reasons = sorted((json.dumps(r["row"]["id"]), r["reason"]) for r in rejects(summary))
    assert reasons == sorted(
        [
            ('{"k": 1}', "key column 'id' holds an object; a key must be text or a number"),
            ('"arr"', "group column 'g' holds an array; a group must be text or a number"),
            ('"num"', "run-at column 'at' holds a number; it must hold ISO 8601 text"),
            ('"flag"', "run-at column 'at' holds a boolean; it must hold ISO 8601 text"),
            ('"obj"', "run-at column 'at' holds an object; it must hold ISO 8601 text"),
        ]
    )


def test_a_key_or_group_holding_a_lone_surrogate_is_a_rejected_row(tmp_path: Path) -> None:
    """``{"id": "a\\ud800"}`` (a JSON escape) was keyed ``"a?"``: enqueue refuses such a key."""
    lines = [
        '{"id": "a\\ud800", "g": "x", "v": 1}',
        '{"id": "b", "g": "\\udc00", "v": 2}',
        '{"id": "c", "g": "x", "v": 3, "note": "\\ud83d"}',
        *(json.dumps({"id": f"k{i}", "g": "x", "v": i}) for i in range(4)),
    ]
    source = write_lines(tmp_path / "lone.jsonl", lines)
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "lone", "--key-column", "id", "--group-column", "g",
        "--payload-columns", "v", "--max-reject-rate", "0.5",
    )  # fmt: skip
    assert (summary.created, summary.rejected) == (5, 2)
    assert set(Message.objects.values_list("key", flat=True)) == {"c", "k0", "k1", "k2", "k3"}
    assert sorted(r["reason"] for r in rejects(summary)) == [
        "group column 'g' contains a lone surrogate (\\udc00 at character 0), which is no "
        "UTF-8 text and no database stores",
        "key column 'id' contains a lone surrogate (\\ud800 at character 1), which is no "
        "UTF-8 text and no database stores",
    ]
    # Without a key column the row is keyed by every column, the one left out too.
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "lone_keyless", "--payload-columns", "v",
        "--rejects", str(tmp_path / "keyless.rejects.jsonl"),
    )  # fmt: skip
    assert (summary.created, summary.rejected) == (7, 0)


def test_an_order_column_beside_payloads_spark_refused_keeps_its_order(tmp_path: Path) -> None:
    """Numbers order as numbers, exactly past 2**53, whatever the payloads hold."""
    base = 2**60
    order = [base + 3, base + 1, base + 2, base, 5]
    rows = [
        {"id": f"k{i}", "g": "one", "n": n, "v": {"a": i, "A": -i, "": None}}
        for i, n in enumerate(order)
    ]
    source = write_lines(tmp_path / "ordered.jsonl", rows)
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "ordered", "--key-column", "id", "--group-column", "g",
        "--order-column", "n",
    )  # fmt: skip
    assert (summary.created, summary.rejected) == (5, 0)
    messages = Message.objects.filter(queue="ordered").order_by("pk")
    assert [m.payload["n"] for m in messages] == sorted(order)
    assert [exact(m.payload) for m in messages] == [
        exact(r) for r in sorted(rows, key=lambda r: r["n"])
    ]
