"""The workers page: every ``run_delayq`` process, live, dead or stopped (read-only).

Rows are written by the workers themselves (``liveness.py``); an operator
only looks. "Dead" means the heartbeat is older than
``DELAYQ["WORKER_DEAD_AFTER"]`` by the database's clock; live workers have
already handed back (or will within one heartbeat) the messages it held.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.utils.text import smart_split
from django.utils.translation import gettext_lazy as _

from django_delayq import clock, liveness, search
from django_delayq.admin.changelist import SafeChangeList, offered_lookups, refuse_nul
from django_delayq.models import Message, WorkerState


@admin.register(WorkerState)
class WorkerStateAdmin(admin.ModelAdmin):  # not [WorkerState]: fails at run time
    list_display = ("name", "state", "host", "pid", "queue_list", "held", "seen", "started_at")
    list_filter = ("host",)
    search_fields = ("name", "host")
    ordering = ("-last_seen",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkerState]:
        held = (
            Message.objects.filter(status=Message.Status.RUNNING, locked_by=OuterRef("name"))
            .order_by()
            .values("locked_by")
            .annotate(n=Count("id"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .annotate(db_now=clock.sql_now(), held_count=Coalesce(Subquery(held), 0))
        )

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return SafeChangeList

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        refuse_nul(request)  # ?host=%00: a DataError on PostgreSQL
        return super().get_changelist_instance(request)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        """Only the host filter the page offers (as on the message changelist)."""
        return lookup in offered_lookups(self, request)

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> WorkerState | None:
        # ?_to_field= (empty): the primary key, not a field named "" (a 500).
        return super().get_object(request, object_id, from_field or None)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WorkerState], search_term: str
    ) -> tuple[QuerySet[WorkerState], bool]:
        """Django's search, within the message search's limits: each word is a
        condition (SQLite refuses an expression tree deeper than 1,000)."""
        refused = search.size_refusal(search_term, len(list(smart_split(search_term))))
        if not refused:
            return super().get_search_results(request, queryset, search_term)
        if not getattr(request, "_delayq_search_warned", False):
            request._delayq_search_warned = True  # type: ignore[attr-defined]
            self.message_user(request, _("Search: nothing is shown: %s.") % refused, "ERROR")
        return queryset.none(), False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        # Django looks the object up before the permission: without this, a user
        # without it got 403 for an id that exists and a redirect for one that does not.
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        return super().history_view(request, object_id, extra_context)

    @admin.display(description=_("state"))
    def state(self, obj: Any) -> str:
        if obj.stopped_at:
            return str(_("stopped"))
        ago = obj.db_now - obj.last_seen
        return str(_("live") if ago <= liveness.dead_after() else _("dead"))

    @admin.display(description=_("last seen"), ordering="last_seen")
    def seen(self, obj: Any) -> str:
        ago = max(timedelta(0), obj.db_now - obj.last_seen)
        return str(_("%(seconds)s s ago") % {"seconds": int(ago.total_seconds())})

    @admin.display(description=_("queues"))
    def queue_list(self, obj: WorkerState) -> str:
        return ", ".join(obj.queues or [])

    @admin.display(description=_("running messages"), ordering="held_count")
    def held(self, obj: Any) -> int:
        return int(obj.held_count)
