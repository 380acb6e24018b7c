"""``MessageAdmin``: the changelist, the change page and the hook for extra admin pages.

Built for a table of millions of rows: the counts are capped or estimated
(``MessagePaginator``), the queue and kind filters list their choices by a
loose index scan (``store.queries.distinct_values``), the date hierarchy reads its
bounds off the primary key (``templatetags/delayq_admin.py``), and the list
query leaves the payload and the traceback in the database. Every change an
operator makes goes through ``django_delayq.operations`` (see ``actions.py``).

Its parts are modules of their own: the columns and read-only fields
(``display.py``), the paginator and the changelist (``changelist.py``), the
filters (``filters.py``), the payload's display and form field
(``payload.py``) and the change form (``forms.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils.safestring import mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_delayq import operations, search
from django_delayq.admin import actions
from django_delayq.admin.changelist import (
    MessageChangeList,
    MessagePaginator,
    is_message_id,
    offered_lookups,
    refuse_nul,
)
from django_delayq.admin.display import MessageDisplayAdmin
from django_delayq.admin.filters import (
    LINKED_LOOKUPS,
    GroupFilter,
    GroupStateFilter,
    KindFilter,
    OverdueFilter,
    QueueFilter,
    RedeliveredFilter,
    RetryingFilter,
    TicksFilter,
    WorkflowFilter,
)
from django_delayq.admin.forms import KIND_LOCKED, MessageForm
from django_delayq.admin.payload import UndecodablePayload, load_deep_payload
from django_delayq.models import STAND_IN_PREFIX, Message
from django_delayq.store import operators

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

S = Message.Status

# -- the hook for extra admin pages ---------------------------------------------------

#: Extra pages under the message changelist's URL (``.../django_delayq/message/<route>``).
#: Each entry is called with the ``MessageAdmin`` and returns a URL pattern; the
#: patterns are placed before the admin's own, so ``"dashboard/"`` is not taken
#: for an object id. Append at import time, from a module that
#: ``django_delayq/admin/__init__.py`` imports, e.g.::
#:
#:     EXTRA_URLS.append(schedules_urlpattern)    # (model_admin) -> path("schedules/", ...)
#:
#: or use :func:`register_view`, which also wraps the view in ``admin_view``
#: (login, CSRF, no caching) and checks a permission.
EXTRA_URLS: list[Callable[[MessageAdmin], URLPattern]] = []

#: Buttons in the changelist's object tools (top right): ``(label, url name)``,
#: the url name without the ``admin:`` namespace, e.g.
#: ``("Dashboard", "django_delayq_message_dashboard")``.
OBJECT_TOOLS: list[tuple[StrOrPromise, str]] = []

ExtraView = Callable[..., HttpResponseBase]


def register_view(
    route: str,
    view: ExtraView,
    name: str,
    *,
    label: StrOrPromise | None = None,
    permission: str = "view",
) -> None:
    """Add ``view(request, model_admin, **url_kwargs)`` at ``<changelist>/<route>``.

    The URL is named ``admin:django_delayq_message_<name>``; the user needs
    the ``permission`` (view, change, delete) on messages. With ``label``, a
    button to it appears on the changelist.
    """
    url_name = f"django_delayq_message_{name}"

    def pattern(model_admin: MessageAdmin) -> URLPattern:
        def checked(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
            if not getattr(model_admin, f"has_{permission}_permission")(request):
                raise PermissionDenied
            return view(request, model_admin, **kwargs)

        return path(route, model_admin.admin_site.admin_view(checked), name=url_name)

    EXTRA_URLS.append(pattern)
    if label:
        OBJECT_TOOLS.append((label, url_name))


SEARCH_HELP = mark_safe(  # noqa: S308 - a constant
    "Words match the key or group (exact or prefix), kind, queue, error text or id; "
    '<code>"connection refused"</code> keeps the spaces. '
    "<code>field=value</code> matches a payload field: <code>companyId=3345</code>, "
    "nested <code>customer.id=7</code>, list items <code>items.0.sku=A1</code>. "
    "Unquoted numbers, <code>true</code>, <code>false</code> and <code>null</code> also match "
    'their string form; quoted values match exactly: <code>name="Jane Doe"</code>. '
    "All terms must match: <code>companyId=3345 status=new</code>."
)

# The change page's timeline: its own fieldset, and all read-only.
TIMELINE = (
    "created_at",
    "first_scheduled",
    "due_display",
    "attempts",
    "redelivery",
    "last_attempt_time",
    "finished_at",
    "updated_at",
)


# A workflow's step: its result, parents and children (shown when it has any).
WORKFLOW = (
    "row_display",
    "result_display",
    "parents_display",
    "children_display",
    "workflow_link",
)


@admin.register(Message)
class MessageAdmin(MessageDisplayAdmin):
    form = MessageForm
    # Seven columns, so that the list fits a laptop's screen beside the admin's
    # sidebar and the filters: the key over its queue, kind and group; the
    # status over the attempts; the long texts cut by the stylesheet (admin.css),
    # whole in their title.
    list_display = (
        "id",
        "key_display",
        "status_display",
        "priority",
        "next_attempt",
        "error",
        "created",
    )
    list_display_links = ("id",)
    list_filter = (
        "status",
        QueueFilter,
        KindFilter,
        GroupFilter,
        GroupStateFilter,
        WorkflowFilter,
        RetryingFilter,
        OverdueFilter,
        RedeliveredFilter,
        TicksFilter,
    )
    # The search box appears because search_fields is set; get_search_results
    # implements the syntax of django_delayq.search instead of Django's.
    search_fields = ("key", "kind", "group", "queue", "last_error")
    search_help_text = SEARCH_HELP
    date_hierarchy = "created_at"
    ordering = ("-id",)
    list_per_page = 100
    list_max_show_all = 500
    show_full_result_count = False
    # Facets count every filter choice over the filtered rows: full scans.
    show_facets = admin.ShowFacets.NEVER
    paginator = MessagePaginator
    actions = actions.ACTIONS
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "queue",
                    "key",
                    "kind",
                    "group",
                    "status_badge_display",
                    "priority",
                    "max_attempts",
                )
            },
        ),
        (gettext_lazy("Payload"), {"fields": ("payload",)}),
        (gettext_lazy("Timeline"), {"fields": TIMELINE}),
        (gettext_lazy("Worker"), {"fields": ("lock_display",)}),
        (gettext_lazy("Last error"), {"fields": ("error_display", "traceback_display")}),
    )
    # Everything but kind, priority, max_attempts and payload: the queue
    # columns belong to the worker (and to the operations, which guard them).
    readonly_fields = (
        "queue",
        "key",
        "group",
        "status_badge_display",
        *TIMELINE,
        "lock_display",
        "error_display",
        "traceback_display",
        "payload_display",
        *WORKFLOW,
    )

    class Media:
        css = {"all": ["django_delayq/admin.css"]}

    # -- change page fields ---------------------------------------------------------

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is not None and (
            obj.on_parent_failure or obj.has_children or obj.result is not None
        ):
            # "stands for" only on a row's stand-in (store/row_steps.py).
            fields = WORKFLOW if obj.queue.startswith(STAND_IN_PREFIX) else WORKFLOW[1:]
            fieldsets.insert(2, (gettext_lazy("Workflow"), {"fields": fields}))
        undecodable = obj is not None and isinstance(obj.payload, UndecodablePayload)
        if self.has_change_permission(request, obj) and not undecodable:
            return fieldsets
        # Read-only: the pretty <pre> instead of Django's one-line JSON.
        return [
            (
                name,
                {
                    **opts,
                    "fields": ["payload_display" if f == "payload" else f for f in opts["fields"]],
                },
            )
            for name, opts in fieldsets
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """The kind, too, while the message runs: it chooses the handler and the limits
        (a kind's global concurrency cap) the running attempt counts against."""
        fields = tuple(super().get_readonly_fields(request, obj))
        if obj is not None and obj.status == S.RUNNING:
            fields += ("kind",)
        if obj is not None and isinstance(obj.payload, UndecodablePayload):
            # Out of the form altogether: a save must not write the text back as a string.
            fields += ("payload",)
        return fields

    def save_model(self, request: HttpRequest, obj: Message, form: Any, change: bool) -> None:
        """Write only the edited columns, so a concurrent worker's changes are kept.

        A kind sent for a message that runs by now (the page was loaded before
        its claim) is not written: the form left it out, or the edit is refused
        whole if the claim came while this request ran (``operators.EditRefused``).
        """
        sent = request.POST.get("kind")
        if "kind" not in form.fields and sent is not None and sent != obj.kind:
            self.message_user(
                request, _("The kind was not changed: %s.") % KIND_LOCKED, level="WARNING"
            )
        try:
            operators.edit(obj, [f for f in form.changed_data if f in MessageForm.Meta.fields])
        except operators.EditRefused:
            request._delayq_edit_refused = True  # type: ignore[attr-defined]
            self.message_user(request, _("Nothing was saved: %s.") % KIND_LOCKED, level="ERROR")

    def response_change(self, request: HttpRequest, obj: Message) -> HttpResponse:
        if getattr(request, "_delayq_edit_refused", False):
            # Back to the page, which shows the message as it is now (running).
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)

    # -- loading ----------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Message]:
        queryset = super().get_queryset(request)
        if getattr(request, "_delayq_defer_payload", False):
            queryset = queryset.defer("payload")
        return queryset

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Message | None:
        """The message, whatever its payload's nesting (``decode_on_a_fresh_stack``).

        ``?_to_field=`` (empty) means the primary key: Django skips its check of
        an empty value, then asked the model for a field named "" (a 500).
        """
        from_field = from_field or None
        try:
            return super().get_object(request, object_id, from_field)
        except RecursionError:
            pass
        request._delayq_defer_payload = True  # type: ignore[attr-defined]
        try:
            obj = super().get_object(request, object_id, from_field)
        finally:
            request._delayq_defer_payload = False  # type: ignore[attr-defined]
        if obj is not None:
            obj.payload = load_deep_payload(obj)
        return obj

    # -- permissions ----------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Messages are produced by enqueue() (validation, de-duplication, NOTIFY).
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and operations.holds_lease(obj):
            return False  # a worker holds it: deleting would pull it from under the worker
        return super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        """The change page's Delete goes the way of the list's delete action
        (:func:`operations.delete`): the message's workflow edges go with it and
        the children that waited for it are decided, and a message a worker
        claimed since the confirmation page was drawn is left alone."""
        result = operations.delete(Message.objects.filter(pk=obj.pk))
        if not result.changed:
            request._delayq_not_deleted = result  # type: ignore[attr-defined]

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> HttpResponse:
        result = getattr(request, "_delayq_not_deleted", None)
        if result is None:
            return super().response_delete(request, obj_display, obj_id)
        why = "; ".join(operations.REASONS.get(k, k) for k in result.skipped) or "it is gone"
        self.message_user(request, f"“{obj_display}” was not deleted: {why}.", messages.WARNING)
        return HttpResponseRedirect(
            reverse("admin:django_delayq_message_change", args=[obj_id])
            if Message.objects.filter(pk=obj_id).exists()
            else reverse("admin:django_delayq_message_changelist")
        )

    # -- changelist -------------------------------------------------------------------

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return MessageChangeList

    def get_sortable_by(self, request: HttpRequest) -> tuple[str, ...]:
        """Columns whose ordering stays cheap on a big table.

        Id (the primary key; ids follow creation) and status (an index) always;
        next attempt and priority once the list is narrowed to messages that
        may still run, a small share of a busy table (sorting every finished
        message by them would read the whole table).
        """
        columns: tuple[str, ...] = ("id", "status_display")
        active = request.GET.get("status__exact") in ("pending", "running")
        if active or request.GET.get("retrying") or request.GET.get("overdue"):
            columns += ("next_attempt", "priority")
        return columns

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        refuse_nul(request)
        return super().get_changelist_instance(request)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        """Only the filters the page offers and those its own links use.

        Django allows any lookup on the model's own columns: ``?key__regex=(``
        (an error on SQLite), ``?payload__contains=1`` or a lookup on the
        traceback were 500s or full scans. Another parameter is refused
        (400, "Filtering by ... not allowed").
        """
        return lookup in offered_lookups(self, request) or lookup in LINKED_LOOKUPS

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Message], search_term: str
    ) -> tuple[QuerySet[Message], bool]:
        parsed = search.parse(search_term)
        if (parsed.errors or parsed.refused) and not getattr(
            request, "_delayq_search_warned", False
        ):
            request._delayq_search_warned = True  # type: ignore[attr-defined]
            if parsed.refused:
                self.message_user(
                    request,
                    _("Search: nothing is shown: %s.") % parsed.refused,
                    level="ERROR",
                )
            for error in parsed.errors:
                self.message_user(request, _("Search: %s") % error, level="WARNING")
        return search.apply(queryset, parsed), False

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Refuse a selection holding something that is not a message id, with a message
        (Django's ``pk__in`` raised ValueError: a 500)."""
        bad = [
            value
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
            if not is_message_id(value)
        ]
        if bad:
            self.message_user(
                request,
                _("Nothing was changed: %(value)s is not a message id.")
                % {"value": repr(bad[0][:40])},
                level="ERROR",
            )
            return None
        # Django 6.1 passes where the action bar is (action_location).
        return super().response_action(request, queryset, *args, **kwargs)

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 passes where the actions are shown (action_location);
        # Django 5.2 has no such argument.
        if action_location is None:
            found = super().get_actions(request)
        else:
            found = super().get_actions(request, action_location=action_location)  # type: ignore[call-arg]
        # Django's own lists every object on its confirmation page and
        # deletes running messages; ours is one DELETE that spares them.
        found.pop("delete_selected", None)
        return found

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST" and "action" in request.POST:
            chosen = actions.chosen_action(request)
            if chosen in actions.ACTION_NAMES and chosen not in self.get_actions(request):
                raise PermissionDenied
        context = {**(extra_context or {}), "delayq_object_tools": self._object_tools()}
        return super().changelist_view(request, context)

    def _object_tools(self) -> list[tuple[StrOrPromise, str]]:
        tools = []
        for label, url_name in OBJECT_TOOLS:
            tools.append((label, reverse(f"{self.admin_site.name}:{url_name}")))
        return tools

    # -- change page --------------------------------------------------------------------

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Message | None = None,
    ) -> HttpResponse:
        if obj is not None:
            context["delayq_operations"] = self._operations_for(request, obj)
            context["delayq_holds_lease"] = operations.holds_lease(obj)
            context["delayq_kind_locked"] = obj.status == S.RUNNING
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _operations_for(self, request: HttpRequest, obj: Message) -> list[dict[str, Any]]:
        buttons = []
        for name in operations.applicable(obj):
            spec = actions.OPERATIONS.get(name)
            if spec is None or spec.permission != "change":
                continue  # delete: Django's own Delete link, guarded above
            if not self.has_change_permission(request, obj):
                continue
            url = reverse(
                f"{self.admin_site.name}:django_delayq_message_operation",
                args=[obj.pk, spec.name],
            )
            buttons.append({"spec": spec, "url": url, "immediate": spec.form_class is None})
        return buttons

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        # Django looks the object up before the permission: without this, a user
        # without it got 403 for an id that exists and a redirect for one that does not.
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        return super().history_view(request, object_id, extra_context)

    def operation_view(self, request: HttpRequest, object_id: str, name: str) -> HttpResponseBase:
        """One operation on one message: the change page's buttons post here."""
        if request.method != "POST":
            return HttpResponse(status=405, headers={"Allow": "POST"})
        spec = actions.OPERATIONS.get(name)
        if spec is None:
            return HttpResponse(status=404)
        permitted = getattr(self, f"has_{spec.permission}_permission")
        # The permission before the lookup: without it, every id gets the same 403.
        if not permitted(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(_("No message with id %s.") % object_id)
        if not permitted(request, obj):
            raise PermissionDenied
        queryset = self.get_queryset(request).filter(pk=obj.pk)
        response = actions.run_operation(self, request, queryset, spec)
        if response is not None:
            return response
        change_url = reverse(f"{self.admin_site.name}:django_delayq_message_change", args=[obj.pk])
        if spec.name == "delete" and not Message.objects.filter(pk=obj.pk).exists():
            change_url = reverse(f"{self.admin_site.name}:django_delayq_message_changelist")
        return HttpResponseRedirect(change_url)

    def get_urls(self) -> list[Any]:
        own = [
            path(
                "<path:object_id>/operation/<str:name>/",
                self.admin_site.admin_view(self.operation_view),
                name="django_delayq_message_operation",
            ),
        ]
        # Extra pages first: the admin's last pattern takes any path as an object id.
        extra = [make(self) for make in EXTRA_URLS]
        return [*extra, *own, *super().get_urls()]
