"""The chaos run, about a tenth of ``make chaos``, inside the suite (PostgreSQL).

Real producer processes, real ``run_delayq`` workers, SIGKILLs, a SIGTERM
and restart, every connection of the test database terminated once, and a
handler that outlives its time limit; then every invariant is checked.
"""

import pytest
from django.db import connection

from tests.chaos.harness import Config, run_chaos
from tests.pooler import behind_pooler

pytestmark = [pytest.mark.process, pytest.mark.postgres_only]


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip(
            "the chaos run terminates database connections (pg_terminate_backend) and relies "
            "on row locks between processes: PostgreSQL only"
        )


def test_short_chaos_run_loses_nothing(worker_env, tmp_path, capsys):
    figures = run_chaos(Config.short(), worker_env, tmp_path)
    with capsys.disabled():
        print("\n" + figures.table())
    assert not figures.violations, figures.table()
    # The faults really happened, or the figures prove nothing.
    assert figures.value("SIGKILLs") == Config.short().kills
    # At least once each (a later attempt may hit it again: the handler runs
    # quickly once its last error is the time limit, and a connection cut can
    # record another error over it).
    assert figures.value("time limits hit") >= Config.short().slow
    assert figures.value("enqueue calls (ledger rows)") == Config.short().messages
    assert int(str(figures.value("workflow children (fan-ins)"))) > 0
    # Every consumer's LISTEN session at least; directly connected, its working
    # connection too. Behind a pooler the pool's few server connections may
    # all be idle and closed at the moment of the cut.
    cut = int(str(figures.value("connection cuts (backends terminated)")))
    if behind_pooler():
        assert cut >= Config.short().consumers
    else:
        assert cut > Config.short().consumers
