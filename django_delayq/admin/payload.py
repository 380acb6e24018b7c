"""A message's payload on the admin's pages: its JSON at any depth, and the form field.

``json.dumps`` with an indent and ``json.loads`` recurse: ``pretty_json``
walks the value with a stack of its own, ``decode_on_a_fresh_stack`` decodes
in a new thread, and a payload that even so cannot be decoded is shown as its
text, read-only (``UndecodablePayload``). ``PrettyJSONField`` is the change
form's payload field; the failures pages (``triage.py``) show payloads the
same way.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from django import forms
from django.db.models import TextField
from django.db.models.functions import Cast
from django.forms.fields import InvalidJSONInput
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_delayq.models import Message
from django_delayq.payload import check_text_depth
from django_delayq.values import escape_surrogates

#: Levels of a payload indented on the pages; deeper levels are written on one line.
PRETTY_DEPTH = 32


def _scalar(value: Any, encoder: type[json.JSONEncoder] | None) -> str:
    text = json.dumps(value, ensure_ascii=False, cls=encoder)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escaped, or the page could not be sent
        text = json.dumps(value, cls=encoder)
    return text


def pretty_json(
    value: Any, *, depth: int = PRETTY_DEPTH, encoder: type[json.JSONEncoder] | None = None
) -> str:
    """``json.dumps(value, indent=2, ensure_ascii=False)``, without recursion.

    ``json.dumps`` with an indent is written in Python and recursive: a payload
    nested about 330 levels deep (well within what ``enqueue`` and the C encoder
    accept) raised ``RecursionError`` and the message's pages answered 500. This
    walks the value with a stack of its own, indents the first ``depth`` levels
    and writes deeper ones on one line, so the page stays readable and its
    width bounded whatever the nesting. The text reads back as the same value.
    """
    out: list[str] = []
    stack: list[Any] = [(value, 0)]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        current, level = item
        if isinstance(current, dict):
            pairs: list[tuple[Any, Any]] = list(current.items())
            opening, closing = "{", "}"
        elif isinstance(current, (list, tuple)):
            pairs = [(None, v) for v in current]
            opening, closing = "[", "]"
        else:
            out.append(_scalar(current, encoder))
            continue
        if not pairs:
            out.append(opening + closing)
            continue
        if level < depth:
            inner = "\n" + "  " * (level + 1)
            parts: list[Any] = [opening + inner]
            separator, end = "," + inner, "\n" + "  " * level + closing
        else:
            parts, separator, end = [opening], ", ", closing
        for i, (key, child) in enumerate(pairs):
            if i:
                parts.append(separator)
            if opening == "{":
                name = key if isinstance(key, str) else json.dumps(key)
                parts.append(_scalar(name, None) + ": ")
            parts.append((child, level + 1))
        parts.append(end)
        stack.extend(reversed(parts))
    return "".join(out)


TOO_DEEP = gettext_lazy("not valid JSON: nested too deeply")


class UndecodablePayload(str):
    """A payload's JSON text that even a fresh stack could not decode: shown as
    text, read-only."""


def decode_on_a_fresh_stack(text: str) -> Any:
    """``json.loads(text)`` in a new thread.

    The C decoder counts the calls already on the stack against the recursion
    limit: a payload that ``enqueue`` encoded from a shallow stack (980 levels)
    could not be decoded under an admin page's 150 or so frames. A new thread
    starts with an empty stack.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = json.loads(text)
        except RecursionError:
            outcome["value"] = UndecodablePayload(text)

    thread = threading.Thread(target=run, name="delayq-admin-json", daemon=True)
    thread.start()
    thread.join()
    return outcome["value"]


def load_deep_payload(message: Message) -> Any:
    """The payload of a message whose row could not be read with it (RecursionError)."""
    text = (
        Message.objects.using(message._state.db)
        .filter(pk=message.pk)
        .values_list(Cast("payload", TextField()), flat=True)
        .get()
    )
    return decode_on_a_fresh_stack(text)


class PrettyJSONField(forms.JSONField):
    """The payload, indented for reading and editing."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, InvalidJSONInput):
            return value
        # A lone surrogate (refused on save) is shown escaped: a page cannot hold one.
        return escape_surrogates(pretty_json(value, encoder=self.encoder))

    def to_python(self, value: Any) -> Any:
        # The depth is checked before the parser recurses into the text;
        # json.loads still raises ValueError on an integer of over 4,300
        # digits, and Django only expects JSONDecodeError.
        if isinstance(value, str):
            try:
                check_text_depth(value)
            except ValueError as exc:
                raise forms.ValidationError(str(exc)) from None
        try:
            return super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(TOO_DEEP, code="invalid") from None
        except ValueError as exc:
            raise forms.ValidationError(
                _("not valid JSON: %s") % exc, code="invalid", params={"value": value}
            ) from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        if isinstance(data, str):
            try:
                check_text_depth(data)
            except ValueError:
                return InvalidJSONInput(data)  # shown again as it was sent
        try:
            return super().bound_data(data, initial)
        except (RecursionError, ValueError):
            return InvalidJSONInput(data)

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return super().has_changed(initial, data)
        except RecursionError:  # json.dumps of the initial value, under a deep stack
            return True
