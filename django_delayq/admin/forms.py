"""The message's change form: kind, priority, attempts cap and payload.

The other columns are read-only on the change page: they belong to the
worker, and to the operations, which guard them.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.translation import gettext_lazy

from django_delayq.admin.payload import PrettyJSONField
from django_delayq.models import MAX_ATTEMPTS_LIMIT, PRIORITY_MAX, PRIORITY_MIN, Message
from django_delayq.payload import check_payload

# Why a running message's kind is not changed (the change form's messages).
KIND_LOCKED = gettext_lazy(
    "the message started running, and its kind cannot change while it runs (the kind "
    "chooses its handler and the limits it counts against); change it once this attempt "
    "has ended"
)


class MessageForm(forms.ModelForm):
    # Bounded here, not only by the database: SQLite checks no integer range,
    # and a value past the column's range must be a form error, not a 500.
    priority = forms.IntegerField(
        min_value=PRIORITY_MIN,
        max_value=PRIORITY_MAX,
        help_text=Message._meta.get_field("priority").help_text,
    )
    max_attempts = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_ATTEMPTS_LIMIT,
        help_text=Message._meta.get_field("max_attempts").help_text,
    )
    payload = PrettyJSONField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 16, "cols": 100, "class": "vLargeTextField"}),
        help_text=gettext_lazy("JSON; takes effect at the next attempt."),
    )

    class Meta:
        model = Message
        fields = ["kind", "priority", "max_attempts", "payload"]

    def clean_payload(self) -> Any:
        value = self.cleaned_data.get("payload")
        try:
            check_payload(value)
        except (TypeError, ValueError) as exc:
            raise forms.ValidationError(str(exc)) from exc
        return value
