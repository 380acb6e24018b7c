"""What the chaos run (``harness.py``) and the adversary run (``adversaries.py``) share:
worker processes and their logs, the faults they inject (SIGKILL, connections
cut), and the run's own database."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from django.db.models import Model

ROOT = Path(__file__).resolve().parents[2]


def now() -> datetime:
    from django.utils import timezone

    return timezone.now()


@dataclass
class Event:
    at: datetime
    kind: str  # "kill", "term", "disrupt"
    pid: int = 0
    detail: int = 0


@dataclass
class Consumer:
    """One ``manage.py run_delayq`` process and its log file."""

    proc: subprocess.Popen[bytes]
    log: Path
    started: datetime
    expected_exit: bool = False
    ended: datetime | None = None


def spawn_worker(args: list[str], env: dict[str, str], log: Path) -> Consumer:
    """Start ``run_delayq args`` with its output in ``log``."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "run_delayq", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Consumer(proc, log, now())


def wait_until_consuming(consumer: Consumer, timeout: float = 60.0) -> bool:
    """Poll the consumer's log (with a deadline) for the line a started worker writes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and consumer.proc.poll() is None:
        if b" consuming " in consumer.log.read_bytes():
            return True
        time.sleep(0.05)
    return False


def kill(consumer: Consumer) -> Event:
    """SIGKILL ``consumer`` and wait for it to be gone."""
    consumer.expected_exit = True
    consumer.proc.send_signal(signal.SIGKILL)
    consumer.proc.wait(timeout=60)
    return Event(now(), "kill", consumer.proc.pid)


def kill_leftovers(consumers: list[Consumer]) -> None:
    """SIGKILL the workers a run left running (it failed or timed out): none may
    outlive the run and consume the next one's messages."""
    for consumer in consumers:
        if consumer.proc.poll() is None:
            consumer.proc.kill()
            consumer.proc.wait(timeout=60)


def cut_connections() -> Event:
    """End every connection to this run's database but our own (PostgreSQL:
    ``pg_terminate_backend``; MariaDB/MySQL: ``KILL``); the event's detail is how many."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            (terminated,) = cursor.fetchone()
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
            terminated = 0
            for (pid,) in cursor.fetchall():
                try:
                    cursor.execute(f"KILL CONNECTION {int(pid)}")
                    terminated += 1
                except Exception:  # it ended meanwhile
                    pass
        else:
            raise RuntimeError(f"no connections to cut on {connection.vendor}")
    return Event(now(), "disrupt", detail=int(terminated))


def time_limits_hit(logs: str) -> int:
    """Attempts the workers' logs say ran past their time limit.

    Each is logged twice, the failure recorded ("attempt N failed ...
    TimeLimitExceeded") and then "ran past its time limit": a SIGKILL between
    the two leaves only the first, so an attempt counts once from either.
    """
    failed = re.findall(
        r"message (\d+) \([^)]*\) attempt (\d+) failed[^\n]*TimeLimitExceeded", logs
    )
    passed = re.findall(
        r"message (\d+) \([^)]*\) ran past its time limit of [^:]*: attempt (\d+)", logs
    )
    return len(set(failed) | set(passed))


def released(logs: str) -> int:
    """Messages the workers' logs say were released from dead workers."""
    total = 0
    for line in logs.splitlines():
        if "stopped sending heartbeats; released" in line:
            total += int(line.split("released ")[1].split(" ")[0])
    return total


def prepare_database(url: str, engines: tuple[str, ...] = ("postgresql",)) -> dict[str, str]:
    """Create (if needed) the run's own database; returns the environment of its
    processes (migrate it next, after ``django.setup()``)."""
    import environ

    config = environ.Env.db_url_config(url)
    engine = config["ENGINE"].rsplit(".", 1)[-1]
    if engine not in engines:
        raise SystemExit(f"this run needs one of {', '.join(engines)}, not {engine}")
    if engine == "postgresql":
        import psycopg

        admin = psycopg.connect(
            host=config["HOST"],
            port=config["PORT"] or 5432,
            user=config["USER"],
            password=config["PASSWORD"] or None,
            dbname="postgres",
            autocommit=True,
        )
        with admin:
            exists = admin.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [config["NAME"]]
            ).fetchone()
            if not exists:
                admin.execute(f'CREATE DATABASE "{config["NAME"]}"')
    elif engine == "mysql":
        import MySQLdb

        admin = MySQLdb.connect(
            host=config["HOST"],
            port=int(config["PORT"] or 3306),
            user=config["USER"],
            password=config["PASSWORD"] or "",
        )
        try:
            admin.cursor().execute(
                f"CREATE DATABASE IF NOT EXISTS `{config['NAME']}` "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            )
        finally:
            admin.close()
    env = dict(os.environ)
    env["DATABASE_URL"] = url
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DELAYQ_TEST_DATABASE_NAME"] = config["NAME"]
    return env


def empty(models: Iterable[type[Model]], using: str = "default") -> None:
    """Empty a run's tables. PostgreSQL truncates them: a ``DELETE`` leaves every
    row dead, and on a cluster without autovacuum each run's table then grows by
    the last run's, slowing every scan of it (a full run took 3.5x as long)."""
    from django.db import connections

    connection = connections[using]
    if connection.vendor == "postgresql":
        names = ", ".join(connection.ops.quote_name(m._meta.db_table) for m in models)
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {names} CASCADE")
        return
    for model in models:
        model._base_manager.using(using).all().delete()


def setup_django(env: dict[str, str]) -> None:
    """Set this process up on the run's database and migrate it."""
    os.environ.update(
        {k: env[k] for k in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "DELAYQ_TEST_DATABASE_NAME")}
    )
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    call_command("migrate", verbosity=0)
    if connection.vendor == "mysql":
        # queue and key with the binary collation the README asks for (as the suite does)
        from django_delayq.store import server

        with connection.cursor() as cursor:
            cursor.execute(server.binary_columns_sql(connection))
