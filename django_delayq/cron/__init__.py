"""Cron schedules: recurring messages installed ahead as ordinary ticks.

``spec.py``: what a schedule is (its options, tick times and keys);
``declared.py``: the schedules in force (code and settings); ``ticks.py``:
what a tick message is, and which ticks to install and cancel; those three
never touch the database. ``install.py`` is the database half (installing
and removing ticks, the overview of ``delayq_cron list`` and the admin);
``missed.py`` cancels a tick a worker claims after its grace.
"""

from __future__ import annotations

from django_delayq.cron.declared import schedule
from django_delayq.cron.spec import Schedule, ScheduleError
from django_delayq.cron.ticks import Tick, tick_of

__all__ = ["Schedule", "ScheduleError", "Tick", "schedule", "tick_of"]
