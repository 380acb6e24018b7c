"""``manage.py run_delayq``: parse, validate, build a Worker, run it."""

from __future__ import annotations

import gc
import logging
import signal
import threading
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.checks import Tags
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from django_delayq.conf import MAX_BATCH_SIZE, MAX_CONCURRENCY
from django_delayq.exceptions import DatabaseUnreachable, WorkerCrashed, WorkerNameTaken
from django_delayq.management import arguments, reload
from django_delayq.routers import queue_alias
from django_delayq.store import server
from django_delayq.worker import Worker

logger = logging.getLogger("django_delayq.worker")


class Command(BaseCommand):
    help = "Consume due messages until SIGTERM/SIGINT (or, with --burst, until none is due)."
    # The checks a worker needs (settings, queues, models; the database's
    # below), not the URLconf's: a worker serves no URL, and importing the
    # project's views would only slow every start.
    requires_system_checks = [Tags.compatibility, Tags.models]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            "-q",
            action="append",
            dest="queues",
            metavar="QUEUE",
            type=arguments.queue_name,
            help="Queue to consume (repeatable). Default: every queue with a handler.",
        )
        parser.add_argument(
            "--concurrency",
            "-c",
            type=arguments.count(MAX_CONCURRENCY),
            default=None,
            help="Handler threads in this process (default: DELAYQ['CONCURRENCY']).",
        )
        parser.add_argument(
            "--batch-size",
            "-b",
            type=arguments.count(MAX_BATCH_SIZE),
            default=None,
            help="Messages claimed per round trip (default: DELAYQ['BATCH_SIZE']).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Process everything due now, then exit 0.",
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help="Development: start a new worker when a file of the project changes "
            "(the running handlers finish first).",
        )
        parser.add_argument(
            "--database",
            default=None,
            type=arguments.database_alias,
            help="Database alias of the queue (default: DELAYQ['DATABASE'], else the router).",
        )
        parser.add_argument(
            "--name",
            default=None,
            type=arguments.worker_name,
            help="Worker name stored in locked_by (at most 255 characters).",
        )
        parser.add_argument(
            "--metrics-port",
            type=arguments.port_number,
            default=None,
            help="Serve Prometheus metrics on this port (default: DELAYQ['METRICS_PORT']); "
            "needs the prometheus extra.",
        )
        parser.add_argument(
            "--metrics-address",
            default=None,
            help="Address the metrics server listens on (default: DELAYQ['METRICS_ADDRESS']).",
        )
        parser.add_argument(
            "--health-port",
            type=arguments.port_number,
            default=None,
            help="Serve /healthz and /readyz on this port (default: DELAYQ['HEALTH_PORT']).",
        )
        parser.add_argument(
            "--health-address",
            default=None,
            help="Address the health server listens on (default: DELAYQ['HEALTH_ADDRESS']).",
        )
        parser.add_argument(
            "--database-outage-limit",
            type=arguments.seconds(),
            default=None,
            metavar="SECONDS",
            help="Exit with status 75 once the database has been unreachable this long "
            "(default: DELAYQ['DATABASE_OUTAGE_LIMIT']; unset: reconnect for ever).",
        )

    def execute(self, *args: Any, **options: Any) -> Any:
        """Run the command; a SIGTERM or SIGINT that comes while it starts (its checks,
        the worker's set-up) stops the worker as soon as it runs: it exits 0,
        having claimed nothing, as a stop asked for a moment later would."""
        self._stop_asked = False
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._ask_stop)
        try:
            return super().execute(*args, **options)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _ask_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop_asked = True

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["verbosity"])
        if options["reload"]:
            if options["burst"]:
                raise CommandError("--reload keeps the worker serving: leave out --burst")
            if not reload.in_child():
                raise SystemExit(reload.supervise())
        # --database, else DELAYQ["DATABASE"], else the routers' choice.
        try:
            alias = queue_alias(options["database"])
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        # The database checks need a connection (the server's version: E050).
        try:
            self.check(tags=[Tags.database], databases=[alias])
        except DatabaseError as exc:  # MariaDB/MySQL: Django's own checks query the server
            raise CommandError(f"cannot reach the database to check it: {exc}") from exc
        try:
            has_tables = server.has_queue_table(connections[alias])
        except DatabaseError:
            # Unreachable for now: the worker waits for it (DATABASE_OUTAGE_LIMIT).
            connections[alias].close()
            has_tables = True
        if not has_tables:
            raise CommandError(
                f"the queue's tables are not on database {alias!r}: "
                f"run `manage.py migrate --database {alias}` first"
            )
        try:
            worker = Worker(
                options["queues"],
                concurrency=options["concurrency"],
                batch_size=options["batch_size"],
                burst=options["burst"],
                using=alias,
                name=options["name"],
                metrics_port=options.get("metrics_port"),
                metrics_address=options.get("metrics_address"),
                health_port=options.get("health_port"),
                health_address=options.get("health_address"),
                database_outage_limit=options.get("database_outage_limit"),
            )
        except (ImproperlyConfigured, TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        worker.install_signal_handlers()
        if self._stop_asked:
            worker.stop()
        changed: list[str] = []
        if options["reload"]:

            def on_change(path: str) -> None:
                changed.append(path)
                logger.info("%s changed: finishing running messages, then reloading", path)
                worker.stop()

            reload.watch(on_change)
        try:
            stats = worker.run()
        except ImproperlyConfigured as exc:  # e.g. the metrics port is taken
            raise CommandError(str(exc)) from exc
        except (DatabaseUnreachable, WorkerCrashed, WorkerNameTaken) as exc:
            # Stopped; the supervisor restarts it (a taken name: once its holder is gone).
            raise CommandError(str(exc), returncode=exc.exit_code) from exc
        finally:
            if getattr(self, "_called_from_command_line", False):
                # The process ends with this command. Its last garbage
                # collection would walk every object Django and the project
                # loaded (a tenth of a second for a small project, a third of
                # a --burst run on an empty queue) to free memory that the
                # exit frees anyway.
                gc.freeze()
        if changed:
            raise SystemExit(reload.RELOAD)
        if options["verbosity"] >= 1 and options["burst"]:
            summary = ", ".join(f"{k} {v}" for k, v in sorted(stats.items())) or "nothing due"
            self.stdout.write(f"run_delayq: {summary}")

    @staticmethod
    def _configure_logging(verbosity: int) -> None:
        """Show log lines the project has not said where to send.

        A project without ``LOGGING`` gets everything at INFO on stderr (its
        handlers' own ``logger.info`` lines included: a worker that prints
        nothing while its schedules run looks dead), the worker's successes
        too at ``-v 2``. A project that configured its logging keeps it; only a
        ``django_delayq`` logger left without anywhere to go gets a console.
        """
        level = logging.INFO if verbosity >= 1 else logging.WARNING
        ours = logging.getLogger("django_delayq")
        root = logging.getLogger()
        if root.handlers or ours.handlers:
            return
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        if getattr(settings, "LOGGING", None):
            ours.addHandler(handler)
        else:
            root.addHandler(handler)
            root.setLevel(level)
        ours.setLevel(logging.DEBUG if verbosity >= 2 else level)
