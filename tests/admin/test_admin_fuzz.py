"""A fuzz test of the admin: generated searches, GET parameters and form posts.

Every admin URL of django_delayq's models (found from the admin site's URL
patterns, custom pages included) gets generated requests from each kind of
user: a superuser, staff who may only view, staff who may change messages,
staff without any django_delayq permission, and an anonymous visitor. What
must hold for every request:

* no 500 (the test client does not re-raise: a view's exception is the 500
  a user would see);
* a GET changes nothing (the queue's tables are compared before and after);
* permissions are as they are: a user without the view permission gets no
  200 anywhere; a user without the change permission changes nothing and
  gets no 200 from a page that changes messages; staff who may change but
  not delete never delete a message.

``make test`` runs a modest number of examples;
``DELAYQ_HYPOTHESIS_PROFILE=thorough`` runs 10,000 (what issue 26 asks of
each database), ``DELAYQ_FUZZ_EXAMPLES=N`` any other number::

    DELAYQ_HYPOTHESIS_PROFILE=thorough DATABASE_URL=... \\
        python -m pytest -p no:cacheprovider tests/admin/test_admin_fuzz.py
"""

from __future__ import annotations

import json
import os
import re
import string
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import quote

import hypothesis
import pytest
from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import URLPattern
from django.utils import timezone
from hypothesis import strategies as st

from django_delayq.admin import actions
from django_delayq.fingerprint import fingerprint
from django_delayq.models import FlowStart, FlowState, Message, QueueState, WorkerState
from django_delayq.payload import check_payload
from tests.admin.staff import staff_client
from tests.factories import MessageFactory

pytestmark = pytest.mark.django_db

PROFILES = {"default": 60, "thorough": 10_000}
PROFILE = os.environ.get("DELAYQ_HYPOTHESIS_PROFILE", "default")
for _name, _examples in PROFILES.items():
    hypothesis.settings.register_profile(
        f"delayq-admin-fuzz-{_name}",
        max_examples=_examples,
        deadline=None,
        database=None,
        suppress_health_check=[
            hypothesis.HealthCheck.function_scoped_fixture,
            hypothesis.HealthCheck.too_slow,
            hypothesis.HealthCheck.filter_too_much,
            hypothesis.HealthCheck.data_too_large,
        ],
    )
FUZZ_SETTINGS = hypothesis.settings.get_profile(
    f"delayq-admin-fuzz-{PROFILE if PROFILE in PROFILES else 'default'}"
)
if os.environ.get("DELAYQ_FUZZ_EXAMPLES"):  # any other number, for a quick look
    FUZZ_SETTINGS = hypothesis.settings(
        FUZZ_SETTINGS, max_examples=int(os.environ["DELAYQ_FUZZ_EXAMPLES"])
    )

ADMIN = "/admin/"
MODELS = (Message, WorkerState)
USERS = ("superuser", "viewer", "operator", "stranger", "anonymous")
ERROR = "app.Boom: card declined"


# -- the URLs --------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """One URL pattern of the admin, its parameters to fill in."""

    name: str
    route: str  # relative to /admin/, with <converters>
    changes: bool  # a page that changes messages (needs the change or delete permission)


def routes() -> list[Route]:
    found = [
        Route("index", "", False),
        Route("app_index", "django_delayq/", False),
    ]
    for model in MODELS:
        prefix = f"{model._meta.app_label}/{model._meta.model_name}/"
        for pattern in admin.site._registry[model].get_urls():
            if not isinstance(pattern, URLPattern) or not pattern.name:
                continue
            route = str(pattern.pattern)
            name = pattern.name
            changes = any(
                word in name
                for word in ("operation", "edit_payload", "failure_group", "queue_state", "delete")
            )
            found.append(Route(name, prefix + route, changes))
    return found


ROUTES = routes()
_CONVERTER = re.compile(r"<(?:(?P<type>\w+):)?(?P<name>\w+)>")


def test_every_page_of_the_app_is_fuzzed():
    names = {r.name for r in ROUTES}
    assert {
        "django_delayq_message_changelist",
        "django_delayq_message_change",
        "django_delayq_message_delete",
        "django_delayq_message_history",
        "django_delayq_message_operation",
        "django_delayq_message_edit_payload",
        "django_delayq_message_dashboard",
        "django_delayq_message_queue_state",
        "django_delayq_message_failures",
        "django_delayq_message_failure_group",
        "django_delayq_message_schedules",
        "django_delayq_workerstate_changelist",
        "django_delayq_workerstate_change",
        "django_delayq_workerstate_history",
        "django_delayq_workerstate_delete",
    } <= names


# -- hostile text ------------------------------------------------------------------------

# Any character but lone surrogates (no client can send one in UTF-8).
ANY_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
HOSTILE = st.sampled_from(
    [
        "",
        "\x00",
        "a\x00b",
        "(",
        "[",
        "*",
        "%",
        "_",
        "\\",
        "'",
        '"',
        "-1",
        "0",
        "1",
        "1.5",
        "1e400",
        "9999",
        "10000",
        "99999999999999999999",
        "-99999999999999999999",
        "NaN",
        "inf",
        "true",
        "null",
        "[]",
        "{}",
        '{"a": 1}',
        "1,2,3",
        "abc",
        "０１",
        "١٢",
        "²",
        "9999-12-31T23:59:59-14:00",
        "0001-01-01T00:00:00+14:00",
        "2026-02-30",
        "x" * 300,
        "ü" * 120,
        "\u202e",
        "\ufeff",
        "<script>alert(1)</script>",
    ]
)
VALUES = st.one_of(HOSTILE, ANY_TEXT, st.integers().map(str))

FILTERS = [
    "q",
    "o",
    "p",
    "all",
    "e",
    "_popup",
    "_to_field",
    "_changelist_filters",
    "status__exact",
    "status__isnull",
    "status__in",
    "queue",
    "kind",
    "group",
    "group_state",
    "retrying",
    "overdue",
    "redelivered",
    "ticks",
    "created_at__year",
    "created_at__month",
    "created_at__day",
    "attempt_count",
    "attempt_count__gt",
    "next_attempt_time__lte",
    "next_attempt_time__gt",
    "finished_at__gte",
    "error_fingerprint",
    "key__startswith",
    "host",
    "host__exact",
    "host__isnull",
]
COLUMNS = [
    "id",
    "key",
    "payload",
    "last_error",
    "last_traceback",
    "created_at",
    "status",
    "lock_token",
    "host",
    "name",
    "queues",
]
LOOKUPS = [
    "regex",
    "iregex",
    "year",
    "month",
    "contains",
    "icontains",
    "in",
    "gt",
    "lt",
    "isnull",
    "has_key",
    "has_keys",
    "startswith",
    "a__b",
    "0",
    "year__gt",
    "date",
    "len",
]
NAMES = st.one_of(
    st.sampled_from(FILTERS),
    st.builds(lambda c, lk: f"{c}__{lk}", st.sampled_from(COLUMNS), st.sampled_from(LOOKUPS)),
    st.text(string.ascii_letters + "_", min_size=1, max_size=20),
    ANY_TEXT.filter(bool),
)

# Searches: words, phrases, payload paths (dotted, deep, with list indexes), quotes.
SEGMENTS = st.one_of(
    st.sampled_from(["a", "id", "customer", "items", "0", "1", "-1", "1_0", "01", "__", "in"]),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=8),
    ANY_TEXT.filter(bool),
)
PATHS = st.lists(SEGMENTS, min_size=1, max_size=40).map(".".join)
TERMS = st.one_of(
    st.builds(lambda p, v: f"{p}={v}", PATHS, VALUES),
    st.builds(lambda p, v: f'{p}="{v}"', PATHS, VALUES),
    st.builds(lambda p, v: f"{p}='{v}", PATHS, VALUES),
    st.builds(lambda v: f'"{v}"', VALUES),
    VALUES,
)
SEARCHES = st.one_of(
    st.lists(TERMS, max_size=30).map(" ".join),
    ANY_TEXT,
    st.builds(lambda n, w: " ".join([w] * n), st.integers(0, 1200), st.sampled_from(["w", "a=1"])),
    st.builds(lambda n: ".".join(["a"] * n) + "=1", st.integers(1, 400)),
)


def query_string(pairs: list[tuple[str, str]]) -> str:
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)


# -- the world the requests meet ---------------------------------------------------------


@dataclass
class World:
    clients: dict[str, Client]
    message_ids: list[int] = field(default_factory=list)
    fingerprint: str = ""


def make_messages() -> list[Message]:
    now = timezone.now()
    failed_fields = {
        "status": "failed",
        "next_attempt_time": None,
        "finished_at": now,
        "attempt_count": 3,
        "last_error": ERROR,
        "last_traceback": f"Traceback (most recent call last):\n{ERROR}",
        "error_fingerprint": fingerprint(ERROR),
    }
    return [
        MessageFactory(key="due", queue="emails", payload={"customer": {"id": 7}}),
        MessageFactory(
            key="later", queue="emails", next_attempt_time=now + timedelta(hours=1), priority=5
        ),
        MessageFactory(
            key="running",
            queue="orders",
            status="running",
            next_attempt_time=now + timedelta(minutes=5),
            lock_token=uuid.uuid4(),
            locked_by="w:1",
            attempt_count=1,
        ),
        MessageFactory(key="failed", queue="orders", group="g-1", **failed_fields),
        MessageFactory(
            key="failed-2", queue="orders", payload={"items": [{"sku": "A1"}]}, **failed_fields
        ),
        MessageFactory(
            key="retrying",
            queue="orders",
            attempt_count=1,
            last_error=ERROR,
            error_fingerprint=fingerprint(ERROR),
            next_attempt_time=now + timedelta(minutes=1),
        ),
        MessageFactory(key="held", queue="orders", group="g-1", next_attempt_time=None),
        MessageFactory(key="done", status="succeeded", next_attempt_time=None, finished_at=now),
        MessageFactory(key="gone", status="cancelled", next_attempt_time=None, finished_at=now),
        # Nested as deep as every database stores (MariaDB refuses 32 levels).
        MessageFactory(key="deep", payload=deep_payload(28)),
    ]


def deep_payload(depth: int) -> object:
    value: object = {"leaf": 1}
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


@pytest.fixture
def world(admin_user) -> World:
    clients: dict[str, Client] = {}
    users: dict[str, User | None] = {"superuser": admin_user, "anonymous": None}
    users["viewer"] = staff_client("viewer", "view_message", "view_workerstate")[1]
    users["operator"] = staff_client(
        "operator", "view_message", "change_message", "view_workerstate"
    )[1]
    users["stranger"] = staff_client("stranger")[1]
    for name, user in users.items():
        client = Client(raise_request_exception=False)
        if user is not None:
            client.force_login(user)
        clients[name] = client
    messages = make_messages()
    WorkerState.objects.create(
        name="w:1", host="host-1", pid=1, started_at=timezone.now(), last_seen=timezone.now()
    )
    QueueState.objects.create(queue="emails", paused=True, paused_by="admin", reason="test")
    return World(clients, [m.pk for m in messages], fingerprint(ERROR))


def snapshot() -> tuple:
    """Every row of the queue's tables, as the database holds them (the key first)."""
    tables = []
    for model in (Message, WorkerState, QueueState, FlowState, FlowStart):
        columns = ["pk", *(f.attname for f in model._meta.concrete_fields)]
        tables.append(list(model.objects.order_by("pk").values_list(*columns)))
    return tuple(tables)


def ensure_messages(world: World) -> None:
    """Put back the messages a previous example deleted, so every page has some."""
    if Message.objects.count() < 5:
        world.message_ids = [m.pk for m in make_messages()]


# -- filling in a URL --------------------------------------------------------------------


def fill(draw, world: World, route: Route) -> str:
    def value(match: re.Match) -> str:
        name = match.group("name")
        if name == "object_id":
            choice = draw(
                st.one_of(
                    st.sampled_from(world.message_ids).map(str),
                    st.just("1"),
                    HOSTILE,
                    ANY_TEXT,
                )
            )
        elif name == "name":
            choice = draw(st.one_of(st.sampled_from(sorted(actions.OPERATIONS)), HOSTILE))
        elif name == "fingerprint":
            choice = draw(st.one_of(st.just(world.fingerprint), HOSTILE, ANY_TEXT))
        elif name == "action":
            choice = draw(st.one_of(st.sampled_from(["retry", "cancel"]), HOSTILE))
        else:
            choice = draw(VALUES)
        # A path segment: never empty, never a slash (another URL altogether).
        return quote(choice.replace("/", "_") or "x", safe="")

    return ADMIN + _CONVERTER.sub(value, route.route)


def form_data(draw, world: World, route: Route) -> dict[str, list[str] | str]:
    """A POST body for the page: its own fields with generated values, and extras."""
    known = st.sampled_from(world.message_ids).map(str)
    ids = st.one_of(known, known, known, HOSTILE, ANY_TEXT)
    fields: dict[str, st.SearchStrategy] = {}
    if route.name.endswith("changelist"):
        fields = {
            "action": st.one_of(
                st.sampled_from(sorted(actions.OPERATIONS)),
                st.sampled_from(sorted(actions.OPERATIONS)),
                st.sampled_from(["", "nope"]),
                HOSTILE,
            ),
            helpers.ACTION_CHECKBOX_NAME: st.lists(ids, max_size=5),
            "select_across": st.sampled_from(["0", "1", "", "yes", "abc"]),
            "index": st.one_of(st.just("0"), st.sampled_from(["1", "-1"]), HOSTILE),
            "post": st.sampled_from(["yes", "no", ""]),
            "delay": st.one_of(st.sampled_from(["90s", "15m", "1h30m", "1d"]), HOSTILE),
            "run_at": VALUES,
            "priority": VALUES,
            "extra_attempts": VALUES,
        }
    elif route.name.endswith("_change"):
        fields = {
            "kind": VALUES,
            "priority": VALUES,
            "max_attempts": VALUES,
            "payload": json_text(),
            "_save": st.just("Save"),
        }
    elif "edit_payload" in route.name:
        fields = {"payload": json_text(), "extra_attempts": VALUES}
    elif "operation" in route.name:
        fields = {
            "post": st.sampled_from(["yes", ""]),
            "delay": VALUES,
            "run_at": VALUES,
            "priority": VALUES,
            "extra_attempts": VALUES,
        }
    elif "failure_group" in route.name:
        fields = {"extra_attempts": VALUES}
    elif "queue_state" in route.name:
        fields = {
            "queue": st.one_of(st.sampled_from(["emails", "orders"]), VALUES),
            "action": st.one_of(st.sampled_from(["pause", "resume"]), HOSTILE),
            "reason": VALUES,
        }
    elif route.name.endswith("_delete"):
        fields = {"post": st.sampled_from(["yes", ""])}
    # The fields that reach the page's work (an action needs its name, the bar's
    # index and a selection; the second step "post") are sent more often than not.
    usual = {"action", "index", helpers.ACTION_CHECKBOX_NAME, "post", "payload", "queue"}
    chosen = [
        name for name in sorted(fields) if draw(st.integers(0, 9)) < (8 if name in usual else 4)
    ]
    data: dict[str, list[str] | str] = {name: draw(fields[name]) for name in chosen}
    for name, value in draw(st.lists(st.tuples(NAMES, VALUES), max_size=3)):
        data.setdefault(name, value)
    return data


def json_text() -> st.SearchStrategy[str]:
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), ANY_TEXT)
    values = st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
        max_leaves=10,
    )
    return st.one_of(
        values.map(lambda v: json.dumps(v, allow_nan=True)),
        st.builds(lambda n: "[" * n + "]" * n, st.integers(0, 2000)),
        st.builds(lambda n: "[" * n, st.sampled_from([10, 1000, 100_000])),
        st.builds(lambda n: '{"a":' * n + "1" + "}" * n, st.integers(0, 1200)),
        HOSTILE,
        ANY_TEXT,
    )


# -- the test ------------------------------------------------------------------------------


#: The pages that take forms: drawn as often again as the others, and posted to more.
FORM_PAGES = {
    "django_delayq_message_changelist",
    "django_delayq_message_change",
    "django_delayq_message_operation",
    "django_delayq_message_edit_payload",
    "django_delayq_message_failure_group",
    "django_delayq_message_queue_state",
}


@st.composite
def requests(draw, world: World):
    route = draw(
        st.one_of(
            st.sampled_from(ROUTES), st.sampled_from([r for r in ROUTES if r.name in FORM_PAGES])
        )
    )
    methods = ["GET", "POST", "POST"] if route.name in FORM_PAGES else ["GET", "GET", "POST"]
    method = draw(st.sampled_from(methods))
    user = draw(st.sampled_from(USERS))
    path = fill(draw, world, route)
    # A POST's query string is the page's filters: mostly none, so that most
    # posts reach the form's work instead of a refused lookup (400).
    posted = method == "POST" and draw(st.integers(0, 3)) > 0
    params = [] if posted else draw(st.lists(st.tuples(NAMES, VALUES), max_size=4))
    if "changelist" in route.name and draw(st.booleans()):
        params.append(("q", draw(SEARCHES)))
    if params:
        path += "?" + query_string(params)
    data = form_data(draw, world, route) if method == "POST" else None
    return route, method, user, path, data


def json_depth(text: str) -> int:
    """How deeply ``text`` nests brackets (outside strings: near enough to skip on)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped = not escaped and char == "\\"
            in_string = escaped or char != '"'
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def depth_refused_before_writing() -> bool:
    """Whether ``check_payload`` (enqueue's, the admin forms') refuses a payload
    nested 40 levels deep: issue 26 item 4 gives every database one depth limit."""
    try:
        check_payload(json.loads("[" * 40 + "]" * 40))
    except (TypeError, ValueError):
        return True
    return False


@FUZZ_SETTINGS
@hypothesis.given(data=st.data())
def test_the_admin_answers_every_generated_request_without_a_500(world, data):
    ensure_messages(world)
    route, method, user, path, body = data.draw(requests(world), label="request")
    if connection.vendor == "mysql" and body and isinstance(body.get("payload"), str):
        # MariaDB's JSON check refuses 32 levels, and until check_payload has the
        # one depth limit of every database (issue 26 item 4) a deeper payload
        # saved from a form is an IntegrityError: left to that item's tests.
        hypothesis.assume(depth_refused_before_writing() or json_depth(body["payload"]) < 32)
    client = world.clients[user]
    before = snapshot()
    if method == "GET":
        response = client.get(path)
    else:
        response = client.post(path, body)
    after = snapshot()
    status = response.status_code
    hypothesis.event(f"status {status}")
    hypothesis.event(f"{user} {method} {route.name}")
    if body and body.get("action") in actions.OPERATIONS:
        confirmed = " confirmed" if body.get("post") == "yes" else ""
        hypothesis.event(f"{user} action {body['action']}{confirmed}: {status}")
    assert status != 500, (user, method, path[:300], body)
    if method == "GET":
        assert before == after, ("a GET changed the tables", user, path)
    if user in ("stranger", "anonymous") and route.name != "index":
        # (The site's index answers staff without any permission: "nothing to edit".)
        assert status != 200, (user, method, path)
    if user in ("viewer", "stranger", "anonymous"):
        assert before == after, ("changed without the permission", user, method, path, body)
        if route.changes or (method == "POST" and route.name.endswith("_change")):
            assert status != 200, (user, method, path)
    if user == "operator":
        assert {row[0] for row in before[0]} <= {row[0] for row in after[0]}, (
            "deleted without the delete permission",
            method,
            path,
            body,
        )
