"""Files under one root through Hadoop's FileSystem: local paths, ``s3a://``, ``hdfs://``.

The archive's staging, publishing and run journal go through the same API as
Spark's own reads and writes, so whatever URL Spark can write, the archive
can publish to. Renames within one file system are what make publishing
safe: on a local disk and on HDFS they are atomic per file.

Everything the pipeline writes is its owner's only, whatever the process's
umask: files are created mode 0600 and the directories the pipeline creates
0700 (the archive's Parquet files, its journal, the report). A local file is
never written through a link planted at its name: :func:`replace_local_file`
writes a new file (``O_EXCL | O_NOFOLLOW``) and renames it over the name,
which replaces a link there instead of following it; the journal's files are
created exclusively under a random name, then renamed into place.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, cast

from django_delayq.contrib.spark import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


#: Hadoop permissions of what the pipeline writes: its owner's only.
FILE_MODE = "600"
DIR_MODE = "700"
#: The Spark session's Hadoop umask (``session.get_session``): what Spark writes
#: itself (Parquet files, their checksums, ``_SUCCESS``) is private as it is created.
UMASK = "077"


def replace_local_file(path: str, write: Callable[[IO[bytes]], object]) -> None:
    """Write the local file ``path`` whole with ``write(handle)``: never through a link.

    The content goes to a new file beside ``path``, created exclusively
    without following links (``O_CREAT | O_EXCL | O_NOFOLLOW``), mode 0600,
    then renamed over ``path``: a rename replaces whatever is at ``path`` (an
    earlier report, a planted symlink) instead of writing through it, and a
    reader sees the old file or the new one, never half of one.
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as handle:
            fd = -1  # the handle owns it now
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Storage:
    def __init__(self, spark: SparkSession, root: str) -> None:
        sc = spark.sparkContext
        self._jvm = cast(Any, sc._jvm)  # classic Spark (py4j), not Spark Connect
        hadoop_conf: Any = sc._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        path = self._jvm.org.apache.hadoop.fs.Path(root)
        self.fs: Any = path.getFileSystem(hadoop_conf)
        self.root: Any = self.fs.makeQualified(path)

    def _permission(self, octal: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.permission.FsPermission(octal)

    def _path(self, rel: str = "") -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self.root, rel) if rel else self.root

    def uri(self, rel: str = "") -> str:
        return str(self._path(rel).toString())

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self._path(rel)))

    def mkdirs(self, rel: str) -> None:
        """Create ``rel`` and its missing parents; those it creates are private (0700)."""
        self._private_mkdirs(self._path(rel))

    def _private_mkdirs(self, path: Any) -> None:
        missing = []
        current = path
        while current is not None and not self.fs.exists(current):
            missing.append(current)
            current = current.getParent()
        self.fs.mkdirs(path)
        for created in missing:
            self.fs.setPermission(created, self._permission(DIR_MODE))

    def make_private(self, rel: str) -> None:
        """Make everything under ``rel`` its owner's only: files 0600, directories 0700
        (what Spark wrote there with the session's umask)."""
        path = self._path(rel)
        if not self.fs.exists(path):
            return
        todo = [self.fs.getFileStatus(path)]
        while todo:
            status = todo.pop()
            if status.isDirectory():
                self.fs.setPermission(status.getPath(), self._permission(DIR_MODE))
                todo.extend(self.fs.listStatus(status.getPath()))
            else:
                self.fs.setPermission(status.getPath(), self._permission(FILE_MODE))

    def delete(self, rel: str) -> None:
        self.fs.delete(self._path(rel), True)

    def rename(self, src: str, dst: str) -> None:
        target = self._path(dst)
        self._private_mkdirs(target.getParent())
        if not self.fs.rename(self._path(src), target):
            raise OSError(f"could not rename {self.uri(src)} to {self.uri(dst)}")

    def list_dirs(self, rel: str) -> list[str]:
        if not self.exists(rel):
            return []
        return sorted(
            str(status.getPath().getName())
            for status in self.fs.listStatus(self._path(rel))
            if status.isDirectory()
        )

    def list_files(self, rel: str) -> list[str]:
        """Data files under ``rel``, recursively, relative to it (no ``_``/``.`` files)."""
        base = self._path(rel)
        prefix = str(base.toUri().getPath()).rstrip("/") + "/"
        found = []
        it = self.fs.listFiles(base, True)
        while it.hasNext():
            path = str(it.next().getPath().toUri().getPath())
            name = path.rsplit("/", 1)[-1]
            if not name.startswith(("_", ".")):
                found.append(path[len(prefix) :])
        return sorted(found)

    def write_text(self, rel: str, text: str) -> None:
        """Write a small file whole, private (0600): created new under a random name,
        then renamed into place."""
        tmp = f"{rel}.{uuid.uuid4().hex}.tmp"
        self._private_mkdirs(self._path(tmp).getParent())
        out = self.fs.create(self._path(tmp), False)
        try:
            self.fs.setPermission(self._path(tmp), self._permission(FILE_MODE))
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        if self.exists(rel):
            self.delete(rel)
        self.rename(tmp, rel)

    def read_text(self, rel: str) -> str:
        stream = self.fs.open(self._path(rel))
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_json(self, rel: str, data: dict[str, Any]) -> None:
        self.write_text(rel, json.dumps(data, indent=1, sort_keys=True))

    def read_json(self, rel: str) -> dict[str, Any]:
        return dict(json.loads(self.read_text(rel)))

    def check_writable(self) -> None:
        """Create the root and a probe file in it, or raise :class:`PipelineError`."""
        probe = f"_delayq_probe_{uuid.uuid4().hex}"
        try:
            if self.fs.exists(self.root) and not self.fs.getFileStatus(self.root).isDirectory():
                raise PipelineError(f"{self.uri()} is a file, not a directory")
            self._private_mkdirs(self.root)
            self.fs.create(self._path(probe), False).close()
            self.fs.delete(self._path(probe), False)
        except PipelineError:
            raise
        except Exception as exc:  # py4j wraps the Java IOException
            raise PipelineError(f"{self.uri()} is not writable: {java_message(exc)}") from exc


def java_message(exc: BaseException) -> str:
    """The first line of what the JVM said, without py4j's trace."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        text = str(java.toString())
    else:
        text = str(exc)
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
