"""``manage.py delayq_cron [list|install|uninstall] [NAME ...]``: schedules by hand.

Thin: the listing, installing and uninstalling live in ``cron/install.py``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq.cron.install import install_schedules, schedule_overview, uninstall_schedules
from django_delayq.cron.spec import ScheduleError
from django_delayq.management import arguments

COLUMNS = ("name", "queue", "schedule", "timezone", "next runs", "last run", "outcome")


def _when(moment: datetime | None, tz: str) -> str:
    if moment is None:
        return "-"
    from zoneinfo import ZoneInfo

    return moment.astimezone(ZoneInfo(tz)).strftime("%Y-%m-%d %H:%M:%S%z")


def _late(late_by: timedelta | None) -> str:
    if late_by is None or late_by < timedelta(seconds=1):
        return ""
    return f" (late by {late_by.total_seconds():.0f}s)"


class Command(BaseCommand):
    help = (
        "List the cron schedules with their next and last runs (default), or install or "
        "uninstall their ticks now."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action", nargs="?", default="list", choices=("list", "install", "uninstall")
        )
        parser.add_argument(
            "names", nargs="*", metavar="NAME", help="Schedules to act on (default: all)."
        )
        parser.add_argument(
            "--database",
            default=None,
            type=arguments.database_alias,
            help="Database alias (default: DELAYQ['DATABASE'], else the router).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action, names, using = options["action"], options["names"] or None, options["database"]
        if action == "install":
            try:
                report = install_schedules(names=names, using=using)
            except ScheduleError as exc:
                raise CommandError(str(exc)) from exc
            for r in report.results:
                if r.error:
                    self.stderr.write(f"{r.schedule}: FAILED: {r.error}")
                    continue
                line = f"{r.schedule}: {r.created} tick(s) installed"
                if r.replaced:
                    line += f", {r.replaced} tick(s) of an older configuration removed"
                if r.missed:
                    line += f", {r.missed} missed tick(s) cancelled"
                if r.caught_up:
                    line += f", missed tick of {r.caught_up.isoformat()} runs now"
                self.stdout.write(line)
            if report.removed:
                self.stdout.write(f"{report.removed} tick(s) of removed schedules deleted")
            if any(r.error for r in report.results):
                raise CommandError("some schedules could not be installed")
            return
        if action == "uninstall":
            try:
                deleted = uninstall_schedules(names, using=using)
            except ScheduleError as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"deleted {deleted} pending tick(s)")
            if deleted:
                self.stdout.write(
                    "running workers install configured schedules again within "
                    "DELAYQ['CRON_INSTALL_INTERVAL']; remove a schedule from the "
                    "configuration to stop it"
                )
            return
        self._list(names, using)

    def _list(self, names: list[str] | None, using: str | None) -> None:
        overview = schedule_overview(using=using)
        if names:
            unknown = sorted(set(names) - {o.name for o in overview})
            if unknown:
                raise CommandError(f"unknown schedule(s): {', '.join(unknown)}")
            overview = [o for o in overview if o.name in names]
        if not overview:
            self.stdout.write("no schedules")
            return
        rows = []
        for o in overview:
            outcome = o.last_status + _late(o.last_late_by) if o.last_status else "-"
            rows.append(
                (
                    o.name,
                    o.queue,
                    o.spec,
                    o.timezone,
                    ", ".join(_when(t, o.timezone) for t in o.next_runs),
                    _when(o.last_run, o.timezone),
                    outcome,
                )
            )
        table = [COLUMNS, *rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
        for n, row in enumerate(table):
            self.stdout.write(
                "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            )
            if n == 0:
                self.stdout.write("  ".join("-" * w for w in widths))
