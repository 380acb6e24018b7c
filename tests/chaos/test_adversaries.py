"""The adversary run's short form, inside the suite, on PostgreSQL, SQLite and MariaDB.

Real workers, producers, lock holders and skewed-clock operators
(``tests/chaos/adversaries.py``); every invariant of the adversary x invariant
table must hold, and every adversary that applies to the database must have
fired, or the table proves nothing.
"""

import pytest
from django.db import connection

from tests.chaos.adversaries import ADVERSARIES, Config, run_adversaries

pytestmark = [pytest.mark.process]


def test_short_adversary_run_breaks_no_promise(worker_env, tmp_path, capsys):
    table = run_adversaries(Config.short(), worker_env, tmp_path)
    with capsys.disabled():
        print("\n" + table.render())
    assert not table.failures, table.render()
    for adversary in ADVERSARIES:
        if adversary.applies(connection.vendor):
            assert table.fired[adversary.name] > 0, f"{adversary.name} never fired"
        else:
            assert adversary.name in table.skipped


@pytest.mark.django_db
@pytest.mark.skipif(
    "connection.vendor == 'sqlite'",
    reason="a live SQLite worker is never taken for dead: its keeper says nothing",
)
def test_the_checker_reads_the_windows_a_worker_says_it_missed_its_heartbeat(caplog):
    # The short form explains what others ran again of a starved worker's messages
    # by the line its keeper logs (worker/keeper.py): the two must agree.
    import logging
    import os
    import time
    from datetime import timedelta

    from django_delayq.worker import Worker
    from tests.chaos.adversaries import late_heartbeats

    worker = Worker(["default"], concurrency=1, burst=True)
    worker.keeper.register()
    gap = worker.keeper.alive_for.total_seconds() + 7.5
    worker.keeper._beaten_at = time.monotonic() - gap
    caplog.set_level(logging.WARNING, logger="django_delayq.worker")
    worker.keeper._turn()
    timed = logging.Formatter("%(asctime)s %(process)d %(message)s")  # tests/settings.py's
    logs = "\n".join(timed.format(record) for record in caplog.records)

    ((start, end),) = late_heartbeats(logs)[os.getpid()]
    assert timedelta(seconds=gap - 0.1) <= end - start <= timedelta(seconds=gap + 0.1)
    assert end.tzinfo is not None
