"""Files under one root through Hadoop's FileSystem: local paths, ``s3a://``, ``hdfs://``.

The archive's staging, publishing and run journal go through the same API as
Spark's own reads and writes, so whatever URL Spark can write, the archive
can publish to. Renames within one file system are what make publishing
safe: on a local disk and on HDFS they are atomic per file.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any, cast

from django_delayq.contrib.spark import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Storage:
    def __init__(self, spark: SparkSession, root: str) -> None:
        sc = spark.sparkContext
        self._jvm = cast(Any, sc._jvm)  # classic Spark (py4j), not Spark Connect
        hadoop_conf: Any = sc._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        path = self._jvm.org.apache.hadoop.fs.Path(root)
        self.fs: Any = path.getFileSystem(hadoop_conf)
        self.root: Any = self.fs.makeQualified(path)

    def _path(self, rel: str = "") -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self.root, rel) if rel else self.root

    def uri(self, rel: str = "") -> str:
        return str(self._path(rel).toString())

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self._path(rel)))

    def mkdirs(self, rel: str) -> None:
        self.fs.mkdirs(self._path(rel))

    def delete(self, rel: str) -> None:
        self.fs.delete(self._path(rel), True)

    def rename(self, src: str, dst: str) -> None:
        target = self._path(dst)
        self.fs.mkdirs(target.getParent())
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
        """Write a small file whole: to a temporary name, then renamed into place."""
        tmp = f"{rel}.{uuid.uuid4().hex}.tmp"
        out = self.fs.create(self._path(tmp), True)
        try:
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
            self.fs.mkdirs(self.root)
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
