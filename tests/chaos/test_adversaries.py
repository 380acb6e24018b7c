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
