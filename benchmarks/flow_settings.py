"""Settings of the flow-control benchmark (``benchmarks/flow.py``).

The benchmark settings plus the limited queues: a rate far above what one
worker achieves (``flow-rate``: its window is one second; ``flow-rate-minute``:
one minute, so the window holds every start of the drain), a concurrency cap
equal to the worker's concurrency (``BENCH_FLOW_CAP``, set by the runner), and
a throttled queue whose window the benchmark keeps full.
"""

import os

from benchmarks.settings import *  # noqa: F403
from benchmarks.settings import DELAYQ, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.flowapp"]
DELAYQ = {
    **DELAYQ,
    "QUEUES": {
        "flow-rate": {"RATE_LIMIT": "100000/s"},
        "flow-rate-minute": {"RATE_LIMIT": "100000/m"},
        "flow-cap": {"GLOBAL_CONCURRENCY": int(os.environ.get("BENCH_FLOW_CAP", "4"))},
        "flow-throttled": {"RATE_LIMIT": "20/m"},
    },
}
