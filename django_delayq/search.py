"""Finding messages: the admin's search syntax, and the cheap value lists of its filters.

Search syntax (terms are separated by spaces and combined with AND):

``word``
    matches the message key or its group (exactly or as a prefix), its kind,
    its queue or its last error (case-insensitive, anywhere); a whole number
    also matches the message id. Quote a phrase to keep its spaces: ``"connection refused"``.
``path=value``
    matches a payload field. ``companyId=3345`` is ``payload["companyId"] ==
    3345``; dots go down into objects: ``customer.id=7``; a number in the
    path is a list index: ``items.0.sku=A1``. Path segments may hold letters,
    digits, ``_`` and ``-`` (not ``__``); a term with another character is
    ignored and reported.
Limits: at most ``MAX_TERMS`` terms, ``MAX_SEARCH_LENGTH`` characters and
``MAX_PATH_DEPTH`` levels in a path, and a list index of at most
``MAX_INDEX_DIGITS`` digits. A search over a limit matches nothing and says
so (``ParsedSearch.refused``): matching more than was asked, under a bulk
action's "select all", would act on messages the operator did not mean.
``value`` forms
    unquoted numbers, ``true``, ``false`` and ``null`` match that JSON value
    *and* its string form (``companyId=3345`` finds ``3345`` and ``"3345"``);
    anything else, and every quoted value (``name="Jane Doe"``,
    ``code='007'``), matches exactly that string.

The same query runs on PostgreSQL, SQLite and MariaDB through Django's
``JSONField`` key lookups, whose keys are always bound parameters. On
PostgreSQL a path without list indexes is compiled to containment
(``payload @> '{"customer": {"id": 7}}'``), which a GIN index on ``payload``
can answer; the results are the same. Every condition a term becomes is one
an index can serve, so that with ``django_delayq.contrib.search_indexes`` a
search on PostgreSQL reads indexes instead of the table.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from django.db import connections
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Collate

from django_delayq.models import Message
from django_delayq.store.features import features
from django_delayq.store.queries import distinct_values

# Matched whole (``fullmatch``): ``$`` would also match before a final newline.
_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?[0-9]+\.[0-9]+(?:[eE][-+]?[0-9]+)?|-?[0-9]+[eE][-+]?[0-9]+")
_LITERALS: dict[str, Any] = {"true": True, "false": False, "null": None}
# JSON numbers beyond 64 bits are not portable between the backends: strings only.
_INT_LIMIT = 2**63 - 1
_PK_LIMIT = 2**63 - 1

#: The longest search string, in characters.
MAX_SEARCH_LENGTH = 1_000
#: The most terms (words and ``path=value``) in one search: each is a condition
#: of the WHERE clause, and SQLite refuses an expression tree deeper than 1,000.
MAX_TERMS = 20
#: The deepest payload path (``a.b.c`` is 3): each level is one nested JSON
#: operator in the SQL, compiled recursively.
MAX_PATH_DEPTH = 32
#: A list index in a path: at most this many digits (PostgreSQL's ``->`` takes
#: a 32-bit integer).
MAX_INDEX_DIGITS = 9

_TOKEN = re.compile(
    r"""
      (?P<path>[^\s="']+)=(?:"(?P<dq>[^"]*)"?|'(?P<sq>[^']*)'?|(?P<bare>[^\s"']*))
    | "(?P<phrase>[^"]*)"?
    | '(?P<sphrase>[^']*)'?
    | (?P<word>\S+)
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class FieldTerm:
    """``path=value``: the payload value at ``path`` equals one of ``values``."""

    path: tuple[str, ...]
    values: tuple[Any, ...]


@dataclass(frozen=True)
class ParsedSearch:
    fields: list[FieldTerm] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Why the whole search was refused (over a limit): it then matches nothing.
    refused: str = ""

    def __bool__(self) -> bool:
        return bool(self.fields or self.words)


def parse_value(raw: str) -> tuple[Any, ...]:
    """The JSON values an unquoted ``raw`` matches: typed first, then its string form."""
    # At most 20 characters: the limit has 19 digits, and int() refuses over 4,300.
    if len(raw) <= 20 and _INT.fullmatch(raw) and abs(int(raw)) <= _INT_LIMIT:
        return (int(raw), raw)
    if _FLOAT.fullmatch(raw) and math.isfinite(float(raw)):
        # 1e999 is no JSON number (float("1e999") is inf): its string form only.
        return (float(raw), raw)
    if raw in _LITERALS:
        return (_LITERALS[raw], raw)
    return (raw,)


def _is_index(segment: str) -> bool:
    """What Django's JSON path takes for a list index: whatever ``int()`` reads."""
    try:
        int(segment)
    except ValueError:
        return False
    return True


def _segment_ok(segment: str) -> bool:
    if not _SEGMENT.fullmatch(segment) or "__" in segment:
        return False
    if _is_index(segment):
        # Plain digits only: Django reads "-1" as the index -1 (an error on
        # SQLite and MariaDB, the last item on PostgreSQL) and "1_0" as 10.
        return segment.isdigit() and len(segment) <= MAX_INDEX_DIGITS
    return True


def parse_path(raw: str) -> tuple[str, ...] | None:
    segments = tuple(raw.split("."))
    if all(_segment_ok(s) for s in segments):
        return segments
    return None


def size_refusal(text: str, terms: int) -> str:
    """Why a search of ``terms`` terms is over a limit ("" when it is not)."""
    if len(text) > MAX_SEARCH_LENGTH:
        return (
            f"the search is {len(text):,} characters long; "
            f"at most {MAX_SEARCH_LENGTH:,} characters are searched"
        )
    if terms > MAX_TERMS:
        return (
            f"the search has more than {MAX_TERMS} terms; "
            f"at most {MAX_TERMS} terms are searched at once"
        )
    return ""


def parse(text: str) -> ParsedSearch:
    """Split a search string into payload terms and words (see the module docstring)."""
    text = text or ""
    if refused := size_refusal(text, 0):
        return ParsedSearch(refused=refused)
    result = ParsedSearch()
    for match in _TOKEN.finditer(text):
        groups = match.groupdict()
        if groups["path"] is not None:
            depth = groups["path"].count(".") + 1
            if depth > MAX_PATH_DEPTH:
                return ParsedSearch(
                    refused=f"a payload path is {depth} levels deep; "
                    f"paths of at most {MAX_PATH_DEPTH} levels are searched"
                )
            path = parse_path(groups["path"])
            if path is None:
                result.errors.append(
                    f"ignored {_shown(match.group(0))}: a payload path is made of names of "
                    "letters, digits, _ and - (a name of digits only is a list index, of at "
                    f"most {MAX_INDEX_DIGITS} digits) separated by dots"
                )
                continue
            if groups["dq"] is not None:
                values: tuple[Any, ...] = (groups["dq"],)
            elif groups["sq"] is not None:
                values = (groups["sq"],)
            else:
                values = parse_value(groups["bare"])
            result.fields.append(FieldTerm(path, values))
        else:
            word = next(
                (groups[g] for g in ("phrase", "sphrase", "word") if groups[g] is not None), ""
            )
            if word.strip():
                result.words.append(word)
        terms = len(result.fields) + len(result.words) + len(result.errors)
        if refused := size_refusal(text, terms):
            return ParsedSearch(refused=refused)
    return result


def _shown(term: str) -> str:
    """A term quoted for a message, cut short if long."""
    return repr(term if len(term) <= 60 else term[:59] + "…")


def _nest(path: tuple[str, ...], value: Any) -> Any:
    for segment in reversed(path):
        value = {segment: value}
    return value


def key_path(path: tuple[str, ...]) -> KeyTransform:
    """``payload -> a -> b``, built explicitly: a key named like a lookup
    (``in``, ``lt``, ``contains``) stays a key, and every key is a bound
    parameter in the SQL Django writes."""
    expression = KeyTransform(path[0], "payload")
    for segment in path[1:]:
        expression = KeyTransform(segment, expression)
    return expression


def field_condition(
    queryset: QuerySet[Message], term: FieldTerm, name: str
) -> tuple[QuerySet[Message], Q]:
    """The condition for one ``path=value`` term (and ``queryset`` with what it needs)."""
    if features(connections[queryset.db]).json_containment and not any(
        s.isdigit() for s in term.path
    ):
        # payload @> '{"a": {"b": v}}': the same rows as the key lookup for
        # scalar values, and a GIN index on payload can serve it.
        conditions = [Q(payload__contains=_nest(term.path, v)) for v in term.values]
    else:
        queryset = queryset.alias(**{name: key_path(term.path)})
        conditions = [Q(**{f"{name}__exact": v}) for v in term.values]
    return queryset, reduce(operator.or_, conditions)


# On MariaDB/MySQL the queue column's collation is binary (README: keys must
# compare exactly), so LIKE there is case-sensitive: search a case-insensitive
# view of it instead, as ILIKE does on PostgreSQL.
_QUEUE_CI = "_delayq_queue_ci"
# Queues and kinds are few: a word is matched against their distinct values
# here (an index skip, search.distinct_values), and the rows are then found by
# ``IN (...)``, which an index serves. More values than this: ``icontains``.
_VALUES_LIMIT = 200


def listed_values(column: str, using: str) -> list[str] | None:
    """The distinct values of ``column`` (``queue`` or ``kind``), or None when
    there are too many to list."""
    values = distinct_values(column, limit=_VALUES_LIMIT + 1, using=using)
    return None if len(values) > _VALUES_LIMIT else values


def holding(values: list[str] | None, word: str) -> list[str] | None:
    """Those of ``values`` that hold ``word`` in any case (None stays None)."""
    if values is None:
        return None
    needle = word.casefold()
    return [value for value in values if needle in value.casefold()]


def word_condition(
    word: str,
    queue_field: str = "queue",
    *,
    queues: list[str] | None = None,
    kinds: list[str] | None = None,
) -> Q:
    """The condition for one word: every branch is one an index can serve.

    The key and the group match exactly or by prefix (``LIKE 'word%'``); the
    queue and the kind among ``queues`` and ``kinds`` (the values that hold
    the word, from ``holding``; None: by ``icontains``); the last
    error anywhere in it, among the messages that have one. With the indexes
    of ``django_delayq.contrib.search_indexes`` PostgreSQL answers the whole
    OR from indexes (a bitmap OR) instead of reading the table.
    """
    condition = Q(key__startswith=word) | (~Q(group="") & Q(group__startswith=word))
    if kinds is None:
        condition |= Q(kind__icontains=word)
    elif kinds:
        condition |= Q(kind__in=kinds)
    if queues is None:
        condition |= Q(**{f"{queue_field}__icontains": word})
    elif queues:
        condition |= Q(queue__in=queues)
    condition |= ~Q(last_error="") & Q(last_error__icontains=word)
    # ASCII digits only: "²".isdigit() is True, but int("²") raises (and so
    # does int() of more than 4,300 digits; the limit has 19).
    if len(word) <= 19 and word.isascii() and word.isdigit() and int(word) <= _PK_LIMIT:
        condition |= Q(pk=int(word))
    return condition


def apply(queryset: QuerySet[Message], search: ParsedSearch | str) -> QuerySet[Message]:
    """``queryset`` narrowed by every term of ``search``."""
    if isinstance(search, str):
        search = parse(search)
    if search.refused:
        return queryset.none()
    if not search:
        return queryset
    conditions = []
    for i, term in enumerate(search.fields):
        queryset, condition = field_condition(queryset, term, f"_delayq_search_{i}")
        conditions.append(condition)
    queue_field = "queue"
    if search.words:
        queues = listed_values("queue", queryset.db)
        kinds = listed_values("kind", queryset.db)
        if queues is None and features(connections[queryset.db]).binary_text:
            queryset = queryset.alias(**{_QUEUE_CI: Collate("queue", "utf8mb4_general_ci")})
            queue_field = _QUEUE_CI
        conditions += [
            word_condition(w, queue_field, queues=holding(queues, w), kinds=holding(kinds, w))
            for w in search.words
        ]
    return queryset.filter(*conditions)
