"""``delayq_pipeline enqueue --after-column``: rows that are workflow steps.

A row names its parents' keys (one key, or an array); its message waits
until they have finished, exactly as ``enqueue(..., after=...)`` makes it
wait. A parent must be a message already there or a row of the load
without parents of its own; a row naming anything else is rejected before
anything is written.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError

from django_delayq import enqueue
from django_delayq.models import Dependency, Message
from tests.pipeline.conftest import run_pipeline, write_csv, write_frame
from tests.testapp.models import Execution

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        run_pipeline(*args)
    assert caught.value.returncode == 2
    return str(caught.value)


def parents_of(queue: str, key: str) -> list[str]:
    child = Message.objects.get(queue=queue, key=key)
    edges = Dependency.objects.filter(child=child).order_by("position")
    return [edge.parent.key for edge in edges.select_related("parent")]


def waiting(queue: str) -> set[str]:
    rows = Message.objects.filter(queue=queue, status="pending", next_attempt_time__isnull=True)
    return set(rows.values_list("key", flat=True))


def test_a_fan_out_and_a_fan_in_load_in_one_run_and_run_in_their_order(
    spark: Any, tmp_path: Path, run_worker: Any
) -> None:
    # 40 accounts (no parents), a step per account after its own account,
    # and one report after every account: the arrays come from Parquet.
    rows: list[tuple[Any, ...]] = [(f"acct-{n}", None, n) for n in range(40)]
    rows += [(f"mail-{n}", [f"acct-{n}"], n) for n in range(40)]
    rows.append(("report", [f"acct-{n}" for n in range(40)], -1))
    source = write_frame(
        spark, tmp_path / "steps.parquet", rows, "key string, after array<string>, n int"
    )

    summary, output = run_pipeline(
        "enqueue", str(source), "--queue", "default", "--key-column", "key",
        "--after-column", "after", "--payload-columns", "n", "--partitions", "3",
    )  # fmt: skip

    assert (summary.rows, summary.created, summary.rejected) == (81, 81, 0)
    assert "created 81" in output
    assert parents_of("default", "report") == [f"acct-{n}" for n in range(40)]
    assert parents_of("default", "mail-7") == ["acct-7"]
    assert waiting("default") == {"report", *(f"mail-{n}" for n in range(40))}
    report = Message.objects.get(key="report")
    assert (report.on_parent_failure, report.parents_waiting) == ("cancel", 40)

    run_worker(["default"], concurrency=4)

    assert set(Message.objects.values_list("status", flat=True)) == {"succeeded"}
    started = {Message.objects.get(pk=e.message_id).key: e.started for e in Execution.objects.all()}
    assert len(started) == 81
    finished = {m.key: m.finished_at for m in Message.objects.all()}
    for n in range(40):
        assert started[f"mail-{n}"] >= finished[f"acct-{n}"]
        assert started["report"] >= finished[f"acct-{n}"]


def test_parents_already_enqueued_and_in_another_queue_from_csv(tmp_path: Path) -> None:
    charged = enqueue("other", {"order": 1}, key="charge-1")
    enqueue("other", {"order": 2}, key="charge-2")
    Message.objects.filter(pk=charged.message.pk).update(
        status="failed", next_attempt_time=None, last_error="card declined"
    )
    source = write_csv(
        tmp_path / "ship.csv",
        ["key", "parent", "order"],
        [["ship-1", "charge-1", 1], ["ship-2", "charge-2", 2], ["ship-3", "", 3]],
    )

    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "default", "--key-column", "key",
        "--after-column", "parent", "--after-queue", "other", "--on-parent-failure", "cancel",
    )  # fmt: skip

    assert (summary.created, summary.rejected) == (3, 0)
    # The failed parent cancelled its child as the load committed; the
    # pending one holds its child; an empty cell is no parent.
    ship = {m.key: m for m in Message.objects.filter(queue="default")}
    assert ship["ship-1"].status == "cancelled"
    assert "charge-1" in ship["ship-1"].last_error or str(charged.message.pk) in (
        ship["ship-1"].last_error
    )
    assert ship["ship-2"].status == "pending" and ship["ship-2"].next_attempt_time is None
    assert ship["ship-3"].next_attempt_time is not None
    assert parents_of("default", "ship-2") == ["charge-2"]


def test_a_parent_that_will_not_exist_is_a_rejected_row_and_nothing_waits_for_it(
    spark: Any, tmp_path: Path
) -> None:
    enqueue("default", {}, key="there")
    rows = [
        ("root", None, 0),
        ("child", ["root", "there"], 1),  # a row of the load, and a message
        ("orphan", ["nowhere"], 2),  # neither
        ("grandchild", ["child"], 3),  # a row with parents of its own
        ("twice", ["root", "root"], 4),
        ("blank", [""], 5),
    ] + [(f"ok-{n}", ["root"], 10 + n) for n in range(200)]
    source = write_frame(
        spark, tmp_path / "s.parquet", rows, "key string, after array<string>, n int"
    )
    rejects = tmp_path / "rejects.jsonl"

    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "default", "--key-column", "key",
        "--after-column", "after", "--rejects", str(rejects), "--max-reject-rate", "0.05",
    )  # fmt: skip

    assert (summary.created, summary.rejected) == (202, 4)
    reasons = {
        r["row"]["key"]: r["reason"] for r in map(json.loads, rejects.read_text().splitlines())
    }
    assert set(reasons) == {"orphan", "grandchild", "twice", "blank"}
    assert "names parent 'nowhere'" in reasons["orphan"]
    assert "names parent 'child'" in reasons["grandchild"]
    assert "later run" in reasons["grandchild"]
    assert reasons["twice"] == "after column 'after' names parent 'root' twice"
    assert reasons["blank"] == "after column 'after' holds an empty key"
    assert parents_of("default", "child") == ["root", "there"]
    assert not Message.objects.filter(key__in=list(reasons)).exists()


def test_over_the_reject_rate_nothing_is_written(spark: Any, tmp_path: Path) -> None:
    rows = [("a", None), ("b", ["missing"])]
    source = write_frame(spark, tmp_path / "s.parquet", rows, "key string, after array<string>")
    message = refused(
        "enqueue", str(source), "--queue", "default", "--key-column", "key",
        "--after-column", "after",
    )  # fmt: skip
    assert "names parent 'missing'" in message
    assert not Message.objects.exists()


def test_a_second_run_writes_nothing_twice(spark: Any, tmp_path: Path) -> None:
    rows = [("p", None), ("c1", ["p"]), ("c2", ["p"])]
    source = write_frame(spark, tmp_path / "s.parquet", rows, "key string, after array<string>")
    args = ("enqueue", str(source), "--queue", "default", "--key-column", "key")
    first, _ = run_pipeline(*args, "--after-column", "after", "--rejects", str(tmp_path / "r1"))
    again, _ = run_pipeline(*args, "--after-column", "after", "--rejects", str(tmp_path / "r2"))
    assert (first.created, again.created, again.ignored) == (3, 0, 3)
    assert Dependency.objects.count() == 2
    assert Message.objects.get(key="c1").parents_waiting == 1


def test_json_lines_take_a_key_or_an_array_of_keys(tmp_path: Path, run_worker: Any) -> None:
    lines = [
        {"id": "a", "n": 1},
        {"id": "b", "n": 2, "after": None},
        {"id": "c", "n": 3, "after": "a"},
        {"id": "d", "n": 4, "after": ["a", "b"]},
        {"id": "e", "n": 5, "after": 7},  # a number is its digits' key
        {"id": "7", "n": 6},
        {"id": "f", "n": 7, "after": [{"k": "a"}]},
        {"id": "g", "n": 8, "after": {"k": "a"}},
        {"id": "h", "n": 9, "after": '["a"]'},  # a string, not an array
    ]
    source = tmp_path / "steps.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))

    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "default", "--key-column", "id",
        "--after-column", "after", "--max-reject-rate", "0.5",
        "--rejects", str(tmp_path / "rejects.jsonl"),
    )  # fmt: skip

    assert (summary.created, summary.rejected) == (6, 3)
    assert parents_of("default", "c") == ["a"]
    assert parents_of("default", "d") == ["a", "b"]
    assert parents_of("default", "e") == ["7"]
    reasons = [
        json.loads(line)["reason"] for line in (tmp_path / "rejects.jsonl").read_text().splitlines()
    ]
    assert sorted(reasons) == sorted(
        [
            "after column 'after' holds an object parent; it must hold a parent's key "
            "(text or a number) or an array of them",
            "after column 'after' holds an object; it must hold a parent's key "
            "(text or a number) or an array of them",
            "after column 'after' names parent '[\"a\"]', which is no message of queue "
            "'default' and no row of this load without parents of its own (a load writes "
            "those first; load later steps of a chain in a later run)",
        ]
    )
    run_worker(["default"])
    assert set(Message.objects.values_list("status", flat=True)) == {"succeeded"}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--on-conflict", "update"], "cannot be combined with --on-conflict update"),
        (["--group-column", "g"], "cannot be combined with --group-column"),
        (["--on-parent-failure", "ignore"], "invalid choice"),
    ],
)
def test_options_that_cannot_go_with_parents_are_refused(
    tmp_path: Path, extra: list[str], expected: str
) -> None:
    source = write_csv(tmp_path / "s.csv", ["key", "after", "g"], [["a", "", "x"]])
    args = ["enqueue", str(source), "--queue", "default", "--key-column", "key"]
    args += ["--after-column", "after", *extra]
    if expected == "invalid choice":
        with pytest.raises(CommandError, match=expected):
            run_pipeline(*args)
    else:
        assert expected in refused(*args)
    assert not Message.objects.exists()


def test_after_queue_needs_an_after_column_and_the_column_a_key_type(
    spark: Any, tmp_path: Path
) -> None:
    source = write_csv(tmp_path / "s.csv", ["key"], [["a"]])
    base = ["enqueue", str(source), "--queue", "default", "--key-column", "key"]
    assert "pass --after-column too" in refused(*base, "--after-queue", "other")
    assert "is not a column" in refused(*base, "--after-column", "nope")
    nested = write_frame(
        spark, tmp_path / "n.parquet", [("a", {"k": "b"})], "key string, after struct<k:string>"
    )
    message = refused(
        "enqueue", str(nested), "--queue", "default", "--key-column", "key",
        "--after-column", "after",
    )  # fmt: skip
    assert "has type struct<k:string>" in message


@pytest.mark.parametrize("seed", [1, 2])
def test_random_rows_load_exactly_the_steps_whose_parents_will_exist(
    spark: Any, tmp_path: Path, seed: int
) -> None:
    # Any mix: roots; steps naming roots, messages already there, keys that
    # are nowhere, and other steps; repeated keys; a few partitions. Each
    # row is written with exactly its parents, in order, or rejected.
    rng = random.Random(seed)
    before = [f"old-{n}" for n in range(10)]
    for key in before:
        enqueue("default", {}, key=key)
    roots = [f"r{n}" for n in range(60)]
    steps = [f"s{n}" for n in range(140)]
    rows: list[tuple[Any, ...]] = [(key, None, n) for n, key in enumerate(roots)]
    named: dict[str, list[str]] = {}
    for n, key in enumerate(steps):
        pool = roots + before + ["nowhere"] * 2 + steps
        named[key] = rng.sample(pool, rng.randint(1, 4))
        rows.append((key, named[key], 100 + n))
    rows.append(("r0", None, -1))  # a repeated root: ignored
    rng.shuffle(rows)
    source = write_frame(
        spark, tmp_path / "s.parquet", rows, "key string, after array<string>, n int"
    )

    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "default", "--key-column", "key",
        "--after-column", "after", "--max-reject-rate", "1", "--partitions", "3",
        "--rejects", str(tmp_path / "rejects.jsonl"),
    )  # fmt: skip

    good = {k for k, parents in named.items() if all(p in roots or p in before for p in parents)}
    assert summary.rejected == len(steps) - len(good)
    assert summary.created == len(roots) + len(good)
    written = set(Message.objects.filter(key__startswith="s").values_list("key", flat=True))
    assert written == good
    for key in good:
        assert parents_of("default", key) == named[key]
        assert Message.objects.get(key=key).parents_waiting == len(named[key])
    assert Dependency.objects.count() == sum(len(named[k]) for k in good)
