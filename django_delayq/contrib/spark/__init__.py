"""The data pipeline on Apache Spark: bulk enqueue, verified archive, delivery report.

Installed with the ``spark`` extra (``pip install "django-delayq[spark]"``) and
driven by ``manage.py delayq_pipeline``. This package is the only place
pyspark is imported; this module itself imports neither pyspark nor Django
models, so the command can say what is missing before anything starts.

Layout:

- ``session.py``     the lazy SparkSession and the environment Spark needs (Java, JDBC jars)
- ``database.py``    Django's DATABASES alias -> what executors and Spark's JDBC source need
- ``dbapi.py``       executor-side writers (bulk upsert, guarded delete); no Django import
- ``jdbc.py``        reading the message table through Spark's JDBC source
- ``storage.py``     files through Hadoop's FileSystem (local paths, s3a://, hdfs://)
- ``enqueue_job.py``, ``archive_job.py``, ``report_job.py``   the three jobs
- ``sources.py``     the enqueue job's data set: its format, columns and their types
- ``row_checks.py``  the enqueue job's checks of every row, in the JVM
- ``rejects.py``     the enqueue job's rejects file
- ``render.py``      the report as a terminal table, HTML and PNG charts
"""

from __future__ import annotations

from django_delayq.conf import MAX_DELAY
from django_delayq.exceptions import DelayQError

INSTALL_HINT = 'pip install "django-delayq[spark]"'


class PipelineError(DelayQError):
    """Bad input or a missing prerequisite, found before anything was written (or a run
    that lost its archive lock, stopped before its next step).

    ``manage.py delayq_pipeline`` turns it into a one-line error and exit
    status 2.
    """


def check_seconds(option: str, seconds: float | None) -> None:
    """Raise :class:`PipelineError` unless ``seconds`` (of ``option``) is None or
    from 0 to ``MAX_DELAY``."""
    if seconds is None:
        return
    if seconds < 0:
        raise PipelineError(f"{option} must not be negative, got {seconds:g}")
    if not seconds <= MAX_DELAY.total_seconds():
        raise PipelineError(
            f"{option} must be at most {MAX_DELAY.days} days "
            f"({MAX_DELAY.total_seconds():.0f} s), got {seconds:g}"
        )


def require_pyspark() -> None:
    """Raise :class:`PipelineError` unless pyspark 4.x can be imported."""
    try:
        import pyspark
    except ImportError as exc:
        raise PipelineError(f"pyspark is not installed ({exc}): {INSTALL_HINT}") from exc
    installed = getattr(pyspark, "__version__", "0")
    if int(installed.split(".")[0]) < 4:
        raise PipelineError(f"pyspark {installed} is too old (4.x needed): {INSTALL_HINT}")
