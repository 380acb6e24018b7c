"""Admin registration for the queue table.

Kept deliberately plain here: operators can list, filter and search
messages; the queue columns that only the worker may set are read-only.
"""

from __future__ import annotations

from django.contrib import admin

from django_delayq.models import Message


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "queue",
        "key",
        "kind",
        "status",
        "priority",
        "next_attempt_time",
        "attempt_count",
        "max_attempts",
        "created_at",
    )
    list_filter = ("status", "queue", "kind")
    search_fields = ("=key", "queue", "kind", "last_error")
    date_hierarchy = "created_at"
    ordering = ("-id",)
    readonly_fields = (
        "status",
        "attempt_count",
        "last_attempt_time",
        "last_error",
        "last_traceback",
        "lock_token",
        "locked_by",
        "scheduled_time",
        "created_at",
        "updated_at",
        "finished_at",
    )
    show_full_result_count = False
