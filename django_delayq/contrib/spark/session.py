"""The SparkSession, started lazily and only by ``delayq_pipeline``.

A laptop needs a few settings before Spark works at all, and they are made
here so the user never has to: the driver binds to 127.0.0.1
(``SPARK_LOCAL_IP``) for local and loopback masters, Python workers run the
interpreter running this code (``PYSPARK_PYTHON``), the session time zone is
UTC (the queue's instants are UTC; partition dates must not depend on the
machine's zone), shuffles use a few partitions (the data is small next to
Spark's default of 200), the JDBC drivers come from Debian's packages (no
Maven download), and Spark's logging is quiet. Every one of them yields to a
value the user set in the environment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from django_delayq.contrib.spark import PipelineError, require_pyspark, storage
from django_delayq.store.features import JDBC_DRIVERS, features

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from pyspark.sql import SparkSession

JAVA_MIN_VERSION = 17
JAVA_HINT = "apt-get install openjdk-17-jre-headless (or set JAVA_HOME)"
LOCAL_MASTER = "local[*]"
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def find_java() -> str | None:
    """The ``java`` Spark will run: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def java_major_version(java: str) -> int | None:
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def check_environment() -> None:
    """pyspark and Java 17+ are there, or a :class:`PipelineError` says what to install."""
    require_pyspark()
    java = find_java()
    if java is None:
        where = "JAVA_HOME/bin/java" if os.environ.get("JAVA_HOME") else "java on PATH"
        raise PipelineError(f"Java was not found ({where}); Spark needs Java 17+: {JAVA_HINT}")
    version = java_major_version(java)
    if version is None or version < JAVA_MIN_VERSION:
        raise PipelineError(
            f"{java} is not Java {JAVA_MIN_VERSION}+ (found {version or 'unknown'}): {JAVA_HINT}"
        )


def resolve_master(master: str | None = None) -> str:
    """``--master``, else ``$SPARK_MASTER``, else local mode on every core."""
    return master or os.environ.get("SPARK_MASTER") or LOCAL_MASTER


def _is_loopback(master: str) -> bool:
    return master.startswith("local") or any(
        host in master for host in ("//127.", "//localhost", "//[::1]")
    )


def jdbc_jars() -> list[str]:
    """The JDBC driver jars that exist, plus any in ``$DELAYQ_SPARK_JARS`` (comma-separated)."""
    jars = [driver.jar for driver in JDBC_DRIVERS if Path(driver.jar).exists()]
    extra = os.environ.get("DELAYQ_SPARK_JARS", "")
    return jars + [j for j in extra.split(",") if j]


def require_jdbc_driver(connection: BaseDatabaseWrapper) -> None:
    """Raise :class:`PipelineError` unless Spark can load the JDBC driver of
    ``connection``'s database: Debian's jar is there, or ``$DELAYQ_SPARK_JARS``
    names jars (the driver's among them). Checked before a job that reads
    through JDBC writes anything."""
    driver = features(connection).jdbc
    if Path(driver.jar).exists() or os.environ.get("DELAYQ_SPARK_JARS"):
        return
    # The vendor's name only names the database in the message.
    raise PipelineError(
        f"the JDBC driver for {connection.vendor} is missing ({driver.jar} does not exist): "
        f"apt-get install {driver.package}, or name its jar in DELAYQ_SPARK_JARS"
    )


def ui_wanted() -> bool:
    """Spark's web UI, unless ``DELAYQ_SPARK_UI`` is 0/false (the tests turn it off)."""
    return os.environ.get("DELAYQ_SPARK_UI", "1").lower() not in ("0", "false", "no", "off")


def prepare_environment(master: str) -> None:
    """Environment variables read when the JVM and the Python workers start."""
    if _is_loopback(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_session(master: str | None = None, *, ui: bool | None = None) -> SparkSession:
    """The process's SparkSession, started on first use.

    A session that is already running (a test's, or one started by a
    previous command in the same process) is reused when it runs on the
    requested master; a different master cannot be had in the same process.
    """
    check_environment()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        running = active.sparkContext.master
        if master and master != running:
            raise PipelineError(
                f"a Spark session on {running} is already running in this process; "
                f"cannot switch to {master}"
            )
        return active

    url = resolve_master(master)
    prepare_environment(url)
    local = url.startswith("local")
    conf = {
        "spark.app.name": "delayq_pipeline",
        "spark.master": url,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4" if local else "16",
        "spark.ui.enabled": str(ui_wanted() if ui is None else ui).lower(),
        "spark.ui.showConsoleProgress": str(sys.stderr.isatty()).lower(),
        # Executors of a standalone cluster run this interpreter too (same
        # machine, or the same path on every node).
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
        "spark.sql.parquet.compression.codec": "zstd",
        # What Spark writes (the archive's Parquet files, their checksums) is
        # its owner's only, whatever the process's umask.
        "spark.hadoop.fs.permissions.umask-mode": storage.UMASK,
    }
    jars = jdbc_jars()
    if jars:
        # spark.jars ships them to the executors; the driver's class path
        # needs them too for DriverManager to find the driver class.
        conf["spark.jars"] = ",".join(jars)
        conf["spark.driver.extraClassPath"] = os.pathsep.join(jars)
    if LOG4J_CONFIG.exists() and "log4j" not in os.environ.get("SPARK_SUBMIT_OPTS", ""):
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def spark_home() -> Path:
    """The Spark distribution inside pyspark (``bin/spark-class`` starts a standalone cluster)."""
    require_pyspark()
    import pyspark

    return Path(pyspark.__file__).parent
