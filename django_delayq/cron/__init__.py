"""Cron schedules: recurring messages installed ahead as ordinary ticks.

``spec.py`` is the pure half (schedules, tick times, keys, the install
plan); ``install.py`` the database half (installing and removing ticks, the
overview of ``delayq_cron list`` and the admin).
"""

from __future__ import annotations

from django_delayq.cron.spec import Schedule, ScheduleError, Tick, schedule, tick_of

__all__ = ["Schedule", "ScheduleError", "Tick", "schedule", "tick_of"]
