"""No-op consumers of the flow-control benchmark's queues (``benchmarks/flow.py``).

The queues' limits are in ``benchmarks/flow_settings.py``; the handlers do
nothing, so a drain measures the queue's own cost and the controls' on top.
"""

from django_delayq import handler

QUEUES = (
    "flow-plain",
    "flow-rate",
    "flow-rate-minute",
    "flow-cap",
    "flow-group",
    "flow-throttled",
    "flow-other",
)


def noop(message):
    """Does nothing."""


for _queue in QUEUES:
    handler(_queue)(noop)
