"""Admin actions on messages, each through an intermediate page.

The pattern is Django's ``delete_selected``: the first POST (from the
changelist's action bar) renders a page that says what will happen (how many
of the selected messages change, how many are skipped and why) and, for
reschedule and reprioritise, asks for the new value; it re-posts the
selection with ``post=yes``, and the second POST calls the operation, reports
the counts with ``message_user`` and returns to the changelist.

"Select all N messages" posts ``select_across=1``: the confirmation page
re-posts that flag (not a list of a million ids) to the same URL, whose query
string still holds the filters and the search, so the operation receives the
whole filtered queryset and runs as one statement.

The actions are thin: parsing and validation here, the work in
``django_delayq.operations``, which code and tests call directly too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_delayq import operations
from django_delayq.conf import MAX_DELAY
from django_delayq.models import PRIORITY_MAX, PRIORITY_MIN, Message
from django_delayq.operations import OperationResult

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

logger = logging.getLogger("django_delayq.admin")

TEMPLATE = "admin/django_delayq/message/action_confirmation.html"
SAMPLE_SIZE = 10


# -- forms ----------------------------------------------------------------------------

_DELAY = re.compile(
    r"\s*(?:(?P<d>[0-9]+)\s*d)?\s*(?:(?P<h>[0-9]+)\s*h)?\s*(?:(?P<m>[0-9]+)\s*m(?:in)?)?"
    r"\s*(?:(?P<s>[0-9]+)\s*s?)?\s*",
    re.IGNORECASE,
)


def parse_delay(text: str) -> timedelta:
    """``90`` or ``90s``, ``15m``, ``2h``, ``1d``, and sums like ``1h30m`` or ``1d 2h``."""
    match = _DELAY.fullmatch(text or "")
    if not match or not any(match.groupdict().values()):
        raise ValueError(f"not a delay: {text!r} (try 90s, 15m, 2h, 1d or 1h30m)")
    too_long = ValueError(f"the delay is over {MAX_DELAY.days} days (about 1,000 years)")
    try:
        parts = {k: int(v) for k, v in match.groupdict().items() if v}
        delay = timedelta(
            days=parts.get("d", 0),
            hours=parts.get("h", 0),
            minutes=parts.get("m", 0),
            seconds=parts.get("s", 0),
        )
    except (OverflowError, ValueError):  # past timedelta's range, or over 4,300 digits
        raise too_long from None
    if delay > MAX_DELAY:
        raise too_long
    return delay


class DelayField(forms.CharField):
    def to_python(self, value: Any) -> timedelta | None:  # type: ignore[override]
        text = super().to_python(value)
        if not text:
            return None
        try:
            return parse_delay(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from exc


class OperationForm(forms.Form):
    def operation_kwargs(self) -> dict[str, Any]:
        return dict(self.cleaned_data)


class RetryForm(OperationForm):
    extra_attempts = forms.IntegerField(
        label=gettext_lazy("More attempts"),
        min_value=1,
        max_value=operations.MAX_EXTRA_ATTEMPTS,
        initial=1,
        help_text=gettext_lazy(
            "How many more attempts each message gets: max attempts becomes the attempts "
            "so far plus this."
        ),
    )


class RescheduleForm(OperationForm):
    run_at = forms.DateTimeField(
        label=gettext_lazy("Run at"),
        required=False,
        widget=forms.DateTimeInput(
            attrs={"type": "datetime-local", "step": 1}, format="%Y-%m-%dT%H:%M:%S"
        ),
    )
    delay = DelayField(
        label=gettext_lazy("or after a delay"),
        required=False,
        help_text=gettext_lazy("From now: 90s, 15m, 2h, 1d or 1h30m."),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["run_at"].help_text = _("Time zone: %s.") % timezone.get_current_timezone_name()

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "run_at" in self.errors or "delay" in self.errors:
            return data  # a field's own error says what is wrong with it
        if data.get("run_at") is None and data.get("delay") is None:
            raise forms.ValidationError(_("Give a time to run at or a delay."))
        if data.get("run_at") is not None and data.get("delay") is not None:
            raise forms.ValidationError(_("Give either a time to run at or a delay, not both."))
        return data

    def operation_kwargs(self) -> dict[str, Any]:
        if self.cleaned_data.get("run_at") is not None:
            return {"run_at": self.cleaned_data["run_at"]}
        return {"delay": self.cleaned_data["delay"]}


class ReprioritiseForm(OperationForm):
    priority = forms.IntegerField(
        label=gettext_lazy("Priority"),
        min_value=PRIORITY_MIN,
        max_value=PRIORITY_MAX,
        initial=0,
        help_text=gettext_lazy("Higher runs first; messages of equal priority run by due time."),
    )


# -- operations as admin actions ---------------------------------------------------------


@dataclass(frozen=True)
class OperationSpec:
    """How one function of ``operations`` appears in the admin."""

    name: str
    function: Callable[..., OperationResult]
    label: StrOrPromise
    title: StrOrPromise
    done: StrOrPromise
    explanation: StrOrPromise
    permission: str = "change"
    form_class: type[OperationForm] | None = None
    # Arguments for the dry run that fills the confirmation page.
    preview_kwargs: dict[str, Any] = field(default_factory=dict)
    # The change page posts these at once (no intermediate page); None: it shows the form.
    button_data: dict[str, str] | None = None


OPERATIONS: dict[str, OperationSpec] = {
    spec.name: spec
    for spec in [
        OperationSpec(
            name="run_now",
            function=operations.run_now,
            label=gettext_lazy("Run now"),
            title=gettext_lazy("Run messages now"),
            done=gettext_lazy("Made due now"),
            explanation=gettext_lazy(
                "Pending messages scheduled for later become due now. Messages already "
                "due keep their place; running and finished ones are left alone."
            ),
            button_data={},
        ),
        OperationSpec(
            name="retry_failed",
            function=operations.retry_failed,
            label=gettext_lazy("Retry"),
            title=gettext_lazy("Retry failed or cancelled messages"),
            done=gettext_lazy("Sent back to pending"),
            explanation=gettext_lazy(
                "Failed and cancelled messages become pending and due now, with more "
                "attempts allowed. Their last error stays until the next attempt."
            ),
            form_class=RetryForm,
            button_data={"extra_attempts": "1"},
        ),
        OperationSpec(
            name="cancel",
            function=operations.cancel,
            label=gettext_lazy("Cancel"),
            title=gettext_lazy("Cancel messages"),
            done=gettext_lazy("Cancelled"),
            explanation=gettext_lazy(
                "Pending messages become cancelled and will not run (Retry brings them "
                "back). A running message is refused while its worker holds the lease."
            ),
            button_data={},
        ),
        OperationSpec(
            name="reschedule",
            function=operations.reschedule,
            label=gettext_lazy("Reschedule…"),
            title=gettext_lazy("Reschedule messages"),
            done=gettext_lazy("Rescheduled"),
            explanation=gettext_lazy(
                "Pending messages get a new due time. Running and finished messages are left alone."
            ),
            form_class=RescheduleForm,
        ),
        OperationSpec(
            name="reprioritise",
            function=operations.reprioritise,
            label=gettext_lazy("Change priority…"),
            title=gettext_lazy("Change the priority of messages"),
            done=gettext_lazy("Reprioritised"),
            explanation=gettext_lazy(
                "Messages that may still run get the new priority (for a running "
                "message it applies if it runs again). Finished messages are left alone."
            ),
            form_class=ReprioritiseForm,
            preview_kwargs={"priority": 0},
        ),
        OperationSpec(
            name="delete",
            function=operations.delete,
            label=gettext_lazy("Delete"),
            title=gettext_lazy("Delete messages"),
            done=gettext_lazy("Deleted"),
            explanation=gettext_lazy(
                "Messages are deleted for good, in one statement. Running messages whose "
                "worker holds the lease are kept."
            ),
            permission="delete",
        ),
    ]
}


def chosen_action(request: HttpRequest) -> str:
    """The action a changelist POST asks for (the page has two action bars)."""
    try:
        index = int(request.POST.get("index", 0))
    except ValueError:
        index = 0
    names = request.POST.getlist("action")
    return names[index] if 0 <= index < len(names) else ""


def report(
    modeladmin: admin.ModelAdmin, request: HttpRequest, spec: OperationSpec, result: OperationResult
) -> None:
    text = ngettext(
        "%(done)s %(count)d message.", "%(done)s %(count)d messages.", result.changed
    ) % {"done": spec.done, "count": result.changed}
    if result.skipped:
        reasons = "; ".join(
            f"{n} {operations.REASONS.get(reason, reason)}" for reason, n in result.skipped.items()
        )
        text += " " + ngettext(
            "Skipped %(count)d: %(reasons)s.",
            "Skipped %(count)d: %(reasons)s.",
            result.skipped_total,
        ) % {"count": result.skipped_total, "reasons": reasons}
    level = messages.WARNING if result.skipped else messages.SUCCESS
    modeladmin.message_user(request, text, level)


def run_operation(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Message],
    spec: OperationSpec,
) -> TemplateResponse | None:
    """Render the intermediate page, or (on ``post=yes``) run the operation and report."""
    confirmed = request.POST.get("post") == "yes"
    form = None
    if spec.form_class is not None:
        form = spec.form_class(request.POST if confirmed else None)
    if confirmed and (form is None or form.is_valid()):
        kwargs = form.operation_kwargs() if form is not None else {}
        try:
            result = spec.function(queryset, **kwargs)
        except (TypeError, ValueError) as exc:
            if form is None:
                raise
            form.add_error(None, str(exc))
        else:
            logger.info("%s by %s: %s", spec.name, request.user, result)
            report(modeladmin, request, spec, result)
            return None

    preview = spec.function(queryset, dry_run=True, **spec.preview_kwargs)
    columns = {f.name for f in queryset.model._meta.concrete_fields}
    bulky = [name for name in ("payload", "last_traceback") if name in columns]
    sample = list(queryset.defer(*bulky)[:SAMPLE_SIZE])
    opts = modeladmin.model._meta
    select_across = forms.BooleanField(required=False).to_python(request.POST.get("select_across"))
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": spec.title,
        "subtitle": None,
        "opts": opts,
        "spec": spec,
        "form": form,
        "preview": preview,
        "reasons": [(operations.REASONS.get(r, r), n) for r, n in preview.skipped.items()],
        "sample": sample,
        "more": max(preview.total - len(sample), 0),
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": select_across,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "changelist_url": reverse(
            f"{modeladmin.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist"
        ),
        "media": modeladmin.media,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


def _action(name: str, description: StrOrPromise) -> Any:
    spec = OPERATIONS[name]

    def action(
        modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Message]
    ) -> TemplateResponse | None:
        return run_operation(modeladmin, request, queryset, spec)

    action.__name__ = action.__qualname__ = name
    action.__doc__ = str(spec.explanation)
    return admin.action(description=description, permissions=[spec.permission])(action)


run_now = _action("run_now", gettext_lazy("Run selected messages now"))
retry_failed = _action("retry_failed", gettext_lazy("Retry selected failed / cancelled messages"))
cancel = _action("cancel", gettext_lazy("Cancel selected messages"))
reschedule = _action("reschedule", gettext_lazy("Reschedule selected messages…"))
reprioritise = _action("reprioritise", gettext_lazy("Change priority of selected messages…"))
delete = _action("delete", gettext_lazy("Delete selected messages"))

ACTIONS = [run_now, retry_failed, cancel, reschedule, reprioritise, delete]
ACTION_NAMES = frozenset(OPERATIONS)
