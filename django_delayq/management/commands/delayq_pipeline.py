"""``manage.py delayq_pipeline enqueue|archive|report``: the data pipeline on Spark.

Needs the ``spark`` extra (``pip install "django-delayq[spark]"``) and Java
17+. The command parses, checks what can be checked before Spark starts,
calls a job in ``django_delayq.contrib.spark`` and prints its summary;
``call_command`` returns the summary object. Bad input or a missing
prerequisite is a one-line error and exit status 2, before anything is
written. Spark starts only here, and only once the input has been checked.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import fields
from datetime import date
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq.contrib.spark import PipelineError
from django_delayq.management import arguments
from django_delayq.models import PARENT_FAILURE_POLICIES

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

JobOptions = TypeVar("JobOptions", bound="DataclassInstance")

FORMATS = ("csv", "parquet", "json")
#: The most Spark partitions (each one a database transaction) --partitions asks for.
MAX_PARTITIONS = 10_000
FINISHED = ("succeeded", "failed", "cancelled")


def _columns(text: str) -> tuple[str, ...]:
    names = tuple(c.strip() for c in text.split(",") if c.strip())
    if not names:
        raise argparse.ArgumentTypeError("name at least one column")
    return names


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None


def _job_options(
    options_class: type[JobOptions], given: dict[str, Any], **named: Any
) -> JobOptions:
    """A job's options (a dataclass): ``named``, and every other field from the
    command's option of the same name."""
    names = [f.name for f in fields(options_class) if f.name not in named]
    return options_class(**{name: given[name] for name in names}, **named)


def _spark_options(parser: argparse.ArgumentParser, database: bool = True) -> None:
    parser.add_argument(
        "--master",
        metavar="URL",
        help="Spark master, e.g. spark://host:7077 (default: $SPARK_MASTER, else local[*])",
    )
    if database:
        parser.add_argument(
            "--database",
            metavar="ALIAS",
            type=arguments.database_alias,
            help="database alias (default: DELAYQ['DATABASE'], else the router)",
        )


class Command(BaseCommand):
    help = (
        "Data pipeline on Spark: bulk-enqueue a data set, archive finished messages "
        "to Parquet, report on delivery."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        enqueue = actions.add_parser(
            "enqueue",
            help="one message per row of a CSV / Parquet / JSON-lines data set",
            description="Enqueue one message per row of SOURCE (a file or a directory), "
            "idempotently: a row's key decides whether it is already there.",
        )
        enqueue.add_argument("source", metavar="SOURCE")
        enqueue.add_argument("--queue", required=True, metavar="Q")
        enqueue.add_argument("--format", choices=FORMATS, help="default: from the file names")
        enqueue.add_argument(
            "--key-column", metavar="COL", help="default: a SHA-256 of the whole row"
        )
        enqueue.add_argument(
            "--payload-columns", type=_columns, metavar="A,B,...", help="default: every column"
        )
        enqueue.add_argument("--kind", default="", metavar="K")
        enqueue.add_argument("--priority", type=int, default=0, metavar="N")
        when = enqueue.add_mutually_exclusive_group()
        when.add_argument("--delay", type=float, metavar="SECONDS", help="default: due now")
        when.add_argument("--run-at-column", metavar="COL", help="each row's due time")
        enqueue.add_argument("--on-conflict", choices=("ignore", "update"), default="ignore")
        enqueue.add_argument(
            "--group-column",
            metavar="COL",
            help="each row's ordered group (empty: none): the messages of a group run one "
            "at a time, in the order of the rows",
        )
        enqueue.add_argument(
            "--order-column",
            metavar="COL",
            help="the order of the rows of each group (default: the order Spark reads "
            "them in); needs --group-column",
        )
        enqueue.add_argument(
            "--after-column",
            metavar="COL",
            help="each row's parents: a key, or an array of keys, of messages that must "
            "finish before the row's message runs (empty: none). A parent is a message "
            "already enqueued or a row of this load without parents of its own",
        )
        enqueue.add_argument(
            "--after-queue",
            metavar="Q",
            help="the queue of the parents named by --after-column (default: --queue)",
        )
        enqueue.add_argument(
            "--on-parent-failure",
            choices=PARENT_FAILURE_POLICIES,
            default="cancel",
            help="what a parent that ends failed or cancelled does to its children: "
            "cancel them (default), make them wait for a retry, or run them anyway",
        )
        enqueue.add_argument(
            "--partitions",
            type=arguments.count(MAX_PARTITIONS),
            metavar="N",
            help=f"1 to {MAX_PARTITIONS:,} (default: the source's partitioning)",
        )
        enqueue.add_argument(
            "--max-reject-rate",
            type=float,
            default=0.01,
            metavar="FRACTION",
            help="invalid rows tolerated (written to a rejects file) before the job "
            "refuses to write anything (default: 0.01)",
        )
        enqueue.add_argument(
            "--rejects",
            metavar="PATH",
            help="the rejects file, one JSON line per invalid row (default: "
            "_NAME.rejects.jsonl beside SOURCE). It is created new, mode 0600; if "
            "anything is already at PATH (an earlier run's file, a symlink) the command "
            "stops before writing anything: move the file away or pass another PATH",
        )
        _spark_options(enqueue)

        archive = actions.add_parser(
            "archive",
            help="move finished messages to Parquet, verified before they are deleted",
        )
        archive.add_argument("--dest", required=True, metavar="DIR", help="path or Hadoop URL")
        archive.add_argument(
            "--older-than", type=float, metavar="SECONDS", help="default: DELAYQ['RETENTION']"
        )
        archive.add_argument(
            "--queue", dest="queues", action="extend", nargs="+", default=[], metavar="Q"
        )
        archive.add_argument("--status", nargs="+", choices=FINISHED, default=list(FINISHED))
        archive.add_argument("--dry-run", action="store_true", help="only say what would move")
        _spark_options(archive)

        report = actions.add_parser("report", help="delivery figures per queue and day")
        report.add_argument("--source", required=True, metavar="DIR", help="an archive --dest")
        report.add_argument("--out", default="delayq-report", metavar="DIR")
        report.add_argument("--since", type=_day, metavar="YYYY-MM-DD")
        report.add_argument(
            "--include-live",
            action="store_true",
            help="also count finished messages not archived yet (read from --database)",
        )
        _spark_options(report)

    def execute(self, *args: Any, **options: Any) -> Any:
        # The summary goes to call_command's caller, not through stdout.
        self.result: Any = None
        super().execute(*args, **options)
        return self.result

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self.result = getattr(self, f"_{options['action']}")(options)
        except PipelineError as exc:
            raise CommandError(str(exc), returncode=2) from exc

    def _session(self, master: str | None) -> Any:
        from django_delayq.contrib.spark import session

        started = time.perf_counter()
        spark = session.get_session(master)
        self.startup = time.perf_counter() - started
        return spark

    def _enqueue(self, o: dict[str, Any]) -> Any:
        from django_delayq.contrib.spark import enqueue_job

        options = enqueue_job.validate_options(
            _job_options(enqueue_job.EnqueueOptions, o, rejects_path=o["rejects"])
        )
        s = enqueue_job.run_enqueue(self._session(o["master"]), options)
        self.stdout.write(
            f"enqueued {s.source} ({s.format}) into queue {s.queue!r}: "
            f"{s.rows:,} row(s) in {s.partitions} partition(s), {s.transactions} transaction(s)"
        )
        rejects = f" -> {s.rejects_path}" if s.rejects_path else ""
        self.stdout.write(
            f"created {s.created:,}, updated {s.updated:,}, ignored {s.ignored:,}, "
            f"rejected {s.rejected:,}{rejects}"
        )
        self.stdout.write(
            f"{s.rows:,} rows in {s.seconds:.1f} s: {s.rate:,.0f} rows/s "
            f"(Spark start-up {self.startup:.1f} s)"
        )
        return s

    def _archive(self, o: dict[str, Any]) -> Any:
        from django_delayq.contrib.spark import archive_job

        options = archive_job.validate_options(
            _job_options(
                archive_job.ArchiveOptions,
                o,
                queues=tuple(o["queues"]),
                statuses=tuple(dict.fromkeys(o["status"])),
            )
        )
        if options.dry_run:
            return self._dry_run(archive_job.dry_run(options))
        try:
            s = archive_job.run_archive(self._session(o["master"]), options)
        except archive_job.ArchiveError as exc:
            raise CommandError(str(exc)) from exc
        if s.recovered_runs:
            self.stdout.write(
                f"completed {s.recovered_runs} interrupted run(s) first: "
                f"deleted {s.recovered_deleted:,} archived message(s)"
            )
        if not s.archived:
            self.stdout.write(f"nothing to archive (finished before {s.cutoff:%Y-%m-%d %H:%M:%S})")
            return s
        self.stdout.write(
            f"archived {s.archived:,} message(s) finished before {s.cutoff:%Y-%m-%d %H:%M:%S} "
            f"to {s.dest} (run {s.run_id}): verified and published"
        )
        kept = f"; kept {s.kept:,} that changed since they were read" if s.kept else ""
        self.stdout.write(f"deleted {s.deleted:,} from the table{kept}")
        self.stdout.write(
            f"{s.archived:,} rows in {s.seconds:.1f} s: {s.rate:,.0f} rows/s "
            f"(Spark start-up {self.startup:.1f} s)"
        )
        return s

    def _dry_run(self, s: Any) -> Any:
        self.stdout.write(
            f"dry run: would archive {s.archived:,} message(s) finished before "
            f"{s.cutoff:%Y-%m-%d %H:%M:%S} to {s.dest}"
        )
        for queue, (count, first, last) in sorted(s.by_queue.items()):
            self.stdout.write(
                f"  {queue}: {count:,} (finished {first:%Y-%m-%d} to {last:%Y-%m-%d})"
            )
        if s.recovered_runs:
            self.stdout.write(f"and first complete {s.recovered_runs} interrupted run(s)")
        return s

    def _report(self, o: dict[str, Any]) -> Any:
        from django_delayq.contrib.spark import report_job

        options = report_job.validate_options(_job_options(report_job.ReportOptions, o))
        spark = self._session(o["master"])
        from django_delayq.contrib.spark import render

        report = report_job.run_report(spark, options)
        files = render.write_report(report, options.out)
        self.stdout.write(render.table(report))
        self.stdout.write("")
        self.stdout.write(f"wrote {', '.join(files)}")
        self.stdout.write(
            f"{report.rows:,} messages in {report.seconds:.1f} s "
            f"(Spark start-up {self.startup:.1f} s)"
        )
        return report
