"""The rejects file of ``delayq_pipeline enqueue``: where it goes, and how it is
written (created new, mode 0600, never through a symlink; one JSON line per
rejected row, safe for any reader's line splitting)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django_delayq.contrib.spark import PipelineError
from django_delayq.contrib.spark.sources import is_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def default_rejects_path(source: str) -> str:
    """``_<name>.rejects.jsonl`` beside SOURCE (``_``: Spark skips it when reading the folder)."""
    name = source.rstrip("/").rsplit("/", 1)[-1] or "source"
    if is_url(source):
        return os.path.abspath(f"_{name}.rejects.jsonl")
    parent = Path(source.rstrip("/")).resolve().parent
    if not os.access(parent, os.W_OK):
        return os.path.abspath(f"_{name}.rejects.jsonl")
    return str(parent / f"_{name}.rejects.jsonl")


def check_rejects_option(path: str) -> str:
    """``--rejects PATH`` made absolute: a local file in a directory that exists.

    (Whether the directory is writable is found when the file is created,
    only if the run has rows to reject.)
    """
    if is_url(path):
        raise PipelineError(f"--rejects {path}: the rejects file must be a local path")
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise PipelineError(f"--rejects {path}: the directory {parent} does not exist")
    return path


def _rejects_exist(path: str) -> PipelineError:
    what = (
        "as a symbolic link, which is not followed: remove it"
        if os.path.islink(path)
        else "(from an earlier run?): move it away"
    )
    return PipelineError(
        f"rejects file {path} already exists {what}, or pass --rejects PATH to write "
        "elsewhere; nothing was written"
    )


def refuse_existing_rejects(path: str) -> None:
    """A rejects file is never overwritten (nor a symlink followed): stop before Spark starts.

    ``write_rejects`` creates the file exclusively too, so a file that appears
    after this check stops the job just the same, still before any row is
    written to the database.
    """
    if os.path.lexists(path):
        raise _rejects_exist(path)


def create_rejects_file(path: str) -> int:
    """A new file at ``path``, mode 0600, for writing: never an existing file, never a symlink.

    ``O_EXCL`` fails if anything is at ``path`` (a dangling or planted symlink
    included), so a shared directory cannot make the job write elsewhere;
    ``fchmod`` makes the mode 0600 whatever the umask.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise _rejects_exist(path) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _rejects_exist(path) from None
        raise PipelineError(
            f"cannot create rejects file {path}: {exc.strerror}; nothing was written"
        ) from exc
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


# What str.splitlines() ends a line at besides \n and \r. JSON text holds them
# raw only inside strings (where the control characters are escaped already,
# by Python and by Spark), so a JSON-lines file escapes them there too: a
# reader's splitlines() then cuts it at its newlines only.
_LINE_BREAKS = {c: f"\\u{c:04x}" for c in (0x0B, 0x0C, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029)}


def jsonl_text(text: str) -> str:
    """JSON ``text`` fit for one line of a JSON-lines file (see ``_LINE_BREAKS``)."""
    return text.translate(_LINE_BREAKS)


def _as_json(line: str) -> str:
    """A JSON line as it is if it is standard JSON, else as a JSON string of its text
    (malformed, or holding NaN or Infinity, which Python's parser takes)."""

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        json.loads(line, parse_constant=refuse)
    except (ValueError, RecursionError):
        return json.dumps(line)
    return line


def reject_record(reason: str, row: str, *, lines: bool = False) -> str:
    """One line of the rejects file: ``{"reason": ..., "row": ...}`` and its newline.

    ``row`` is the row's JSON text (``to_json``'s), or with ``lines`` the
    JSON line itself, given as a JSON string if it is not JSON.
    """
    text = _as_json(row) if lines else row
    return jsonl_text(f'{{"reason": {json.dumps(reason)}, "row": {text}}}') + "\n"


def write_rejects(prepared: DataFrame, path: str, *, lines: bool = False) -> None:
    """The rejected rows as JSON lines (``reject_record``), in a new 0600 file.

    If reading the rows fails, the partial file is removed (a re-run then
    finds the path free).
    """
    from pyspark.sql import functions as F

    rejected = prepared.filter(F.col("reason").isNotNull()).select("reason", "row")
    fd = create_rejects_file(path)
    created = os.fstat(fd)
    try:
        with open(fd, "w", encoding="utf-8") as out:
            for record in rejected.toLocalIterator():
                out.write(reject_record(record["reason"], record["row"], lines=lines))
    except BaseException:
        try:
            if os.path.samestat(created, os.lstat(path)):  # still the file created above
                os.unlink(path)
        except OSError:
            pass
        raise
