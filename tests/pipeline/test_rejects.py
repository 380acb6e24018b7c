"""The enqueue job's rejects file: created exclusively, mode 0600, never through a symlink."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError

from django_delayq.contrib.spark import PipelineError, enqueue_job
from django_delayq.models import Message
from tests.pipeline.conftest import run_pipeline, write_csv

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

HEADER = ["email", "n"]
REJECTS = "_in.csv.rejects.jsonl"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """200 rows, one of them with a null key (0.5%: under the default reject rate)."""
    rows: list[list[object]] = [[f"user{i}@example.com", i] for i in range(200)]
    rows[7][0] = ""
    return write_csv(tmp_path / "in.csv", HEADER, rows)


def args(source: Path, *more: str) -> tuple[str, ...]:
    return ("enqueue", str(source), "--queue", "q", "--key-column", "email", *more)


def refused(*command: str) -> str:
    """Run the command, expect exit status 2 with one line; return that line."""
    with pytest.raises(CommandError) as caught:
        run_pipeline(*command)
    assert caught.value.returncode == 2
    message = str(caught.value)
    assert "\n" not in message
    return message


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_symlink_at_the_rejects_path_is_refused_and_its_target_untouched(
    source: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / REJECTS)

    message = refused(*args(source))
    assert str(tmp_path / REJECTS) in message and "symbolic link" in message
    assert "--rejects" in message and "nothing was written" in message
    assert victim.read_text() == "precious\n"
    assert (tmp_path / REJECTS).is_symlink()
    assert not Message.objects.exists()


def test_a_symlink_planted_after_the_checks_is_refused_before_any_write(
    spark: object, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exclusive create itself refuses a path that appeared once the checks had passed."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    prepare = enqueue_job.prepare

    def plant_then_prepare(*a: Any, **kw: Any) -> Any:
        os.symlink(victim, tmp_path / REJECTS)  # the options were checked a moment ago
        return prepare(*a, **kw)

    monkeypatch.setattr(enqueue_job, "prepare", plant_then_prepare)
    options = enqueue_job.EnqueueOptions(source=str(source), queue="q", key_column="email")
    with pytest.raises(PipelineError, match="already exists") as caught:
        enqueue_job.run_enqueue(spark, options)  # type: ignore[arg-type]
    assert "nothing was written" in str(caught.value)
    assert victim.read_text() == "precious\n"
    assert (tmp_path / REJECTS).is_symlink()
    assert not Message.objects.exists()


def test_a_symlink_beside_the_rejects_path_is_not_followed(source: Path, tmp_path: Path) -> None:
    """No temporary file with a guessable name is opened either."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / f"{REJECTS}.tmp")

    summary, _ = run_pipeline(*args(source))
    assert (summary.created, summary.rejected) == (199, 1)
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / REJECTS).is_symlink()
    assert len((tmp_path / REJECTS).read_text().splitlines()) == 1


def test_the_rejects_file_is_private_whatever_the_umask(source: Path, tmp_path: Path) -> None:
    previous = os.umask(0o000)
    try:
        summary, _ = run_pipeline(*args(source))
    finally:
        os.umask(previous)
    assert summary.rejects_path == str(tmp_path / REJECTS)
    assert mode(tmp_path / REJECTS) == 0o600
    [line] = (tmp_path / REJECTS).read_text().splitlines()
    assert json.loads(line) == {
        "reason": "key column 'email' is null",
        "row": {"email": None, "n": 7},
    }


def test_an_existing_rejects_file_is_not_overwritten(source: Path, tmp_path: Path) -> None:
    earlier = tmp_path / REJECTS
    earlier.write_text("from an earlier run\n")

    message = refused(*args(source))
    assert message.startswith(f"rejects file {earlier} already exists")
    assert "--rejects" in message and "nothing was written" in message
    assert earlier.read_text() == "from an earlier run\n"
    assert not Message.objects.exists()

    # The way through: another path (or moving the old file away).
    elsewhere = tmp_path / "today.rejects.jsonl"
    summary, output = run_pipeline(*args(source, "--rejects", str(elsewhere)))
    assert (summary.created, summary.rejected) == (199, 1)
    assert summary.rejects_path == str(elsewhere)
    assert f"rejected 1 -> {elsewhere}" in output
    assert mode(elsewhere) == 0o600 and len(elsewhere.read_text().splitlines()) == 1
    assert earlier.read_text() == "from an earlier run\n"


def test_a_rejects_path_in_a_missing_directory_is_refused_before_spark_reads(
    source: Path, tmp_path: Path
) -> None:
    target = tmp_path / "nope" / "r.jsonl"
    message = refused(*args(source, "--rejects", str(target)))
    assert message == f"--rejects {target}: the directory {target.parent} does not exist"
    assert not Message.objects.exists()


# Every character but \n and \r that str.splitlines() breaks a line at.
LINE_BREAKERS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def test_rejects_lines_hold_no_raw_line_breaks_for_splitlines(tmp_path: Path) -> None:
    """A rejected row's text kept U+0085, U+2028 and U+2029 raw: ``splitlines()`` cut its
    line in two, and neither half was JSON."""
    text = f"a{LINE_BREAKERS}b"
    rows: list[list[object]] = [[f"user{i}@example.com", i] for i in range(8)]
    rows += [["", text], ["x" * 256 + text, 9]]
    csv_source = write_csv(tmp_path / "breaks.csv", HEADER, rows)
    summary, _ = run_pipeline(*args(csv_source, "--max-reject-rate", "0.5"))
    assert (summary.created, summary.rejected) == (8, 2)
    lines = Path(str(summary.rejects_path)).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"reason": "key column 'email' is null", "row": {"email": None, "n": text}},
        {
            "reason": f"key column 'email' is {256 + len(text)} characters, over 255",
            "row": {"email": "x" * 256 + text, "n": "9"},  # a column of text, beside the first
        },
    ]

    nan_line = json.dumps({"email": "b0", "n": [{"\x85": None}, math.nan]}, ensure_ascii=False)
    null_line = json.dumps({"email": None, "n": text}, ensure_ascii=False)
    at_line = json.dumps({"email": "b2", "n": 1, "at": text}, ensure_ascii=False)
    good = [json.dumps({"email": f"g{i}", "n": i, "at": "2030-01-01T00:00:00Z"}) for i in range(8)]
    json_source = tmp_path / "breaks.jsonl"
    json_source.write_text("\n".join([nan_line, null_line, at_line, *good]) + "\n", "utf-8")
    summary, _ = run_pipeline(
        *args(json_source, "--run-at-column", "at", "--max-reject-rate", "0.5")
    )
    assert (summary.created, summary.rejected) == (8, 3)
    lines = Path(str(summary.rejects_path)).read_text(encoding="utf-8").splitlines()
    found = [json.loads(line) for line in lines]
    assert sorted(found, key=lambda r: r["reason"]) == [
        {"reason": "key column 'email' is null", "row": {"email": None, "n": text}},
        {
            # Not JSON (NaN): the line is given as its text.
            "reason": "payload['n'][1] is nan, which JSON cannot hold",
            "row": nan_line,
        },
        {
            "reason": f"run-at column 'at' is not a timestamp: {text}",
            "row": {"email": "b2", "n": 1, "at": text},
        },
    ]
