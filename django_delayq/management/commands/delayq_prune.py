"""``manage.py delayq_prune``: delete finished messages past their retention."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq.conf import MAX_PRUNE_BATCH_SIZE
from django_delayq.management import arguments
from django_delayq.retention import MAX_PRUNE_PAUSE, prune

#: Half the time deleting, half waiting: a claim beside a prune of millions
#: of rows keeps near its usual times (docs/explanation/performance.md).
DEFAULT_PAUSE = 1.0


class Command(BaseCommand):
    help = "Delete finished messages older than DELAYQ['RETENTION'] (or --older-than)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=arguments.seconds(zero=True),
            default=None,
            metavar="SECONDS",
            help="Override the retention, in seconds.",
        )
        parser.add_argument(
            "--queue", action="append", dest="queues", metavar="QUEUE", type=arguments.queue_name
        )
        parser.add_argument(
            "--batch-size",
            type=arguments.count(MAX_PRUNE_BATCH_SIZE),
            default=None,
            help=f"Rows deleted per statement, 1 to {MAX_PRUNE_BATCH_SIZE:,}.",
        )
        parser.add_argument(
            "--pause",
            type=arguments.factor(MAX_PRUNE_PAUSE),
            default=DEFAULT_PAUSE,
            metavar="FACTOR",
            help=(
                "After each batch, wait this many times as long as it took, so that "
                f"workers keep the server's disk and CPU (default {DEFAULT_PAUSE:g}; "
                "0 deletes as fast as the server goes)."
            ),
        )
        parser.add_argument("--database", default=None, type=arguments.database_alias)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            deleted = prune(
                older_than=options["older_than"],
                batch_size=options["batch_size"],
                queues=options["queues"],
                using=options["database"],
                pause=options["pause"],
            )
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"deleted {deleted} finished message(s)")
