"""The message changelist: columns, every filter, the date hierarchy, cheap counts."""

import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_delayq.admin import messages as message_admin
from django_delayq.admin.changelist import MessagePaginator
from django_delayq.admin.display import local_time
from django_delayq.models import Message
from django_delayq.store import queries
from tests.admin.message_pages import CHANGELIST, listed, one_of_each
from tests.factories import MessageFactory

qn = connection.ops.quote_name  # "name" on PostgreSQL and SQLite, `name` on MariaDB/MySQL

pytestmark = pytest.mark.django_db


@pytest.fixture
def states(fake_clock):
    return one_of_each(fake_clock())


def row_of(response, message) -> str:
    html = response.content.decode()
    start = html.index(f'value="{message.pk}" class="action-select"')
    return html[start : html.index("</tr>", start)]


def test_columns_show_badge_relative_time_attempts_and_first_error_line(admin_client, states):
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    failed = row_of(response, states["failed"])
    assert '<span class="dq-badge dq-failed">failed</span>' in failed
    assert "5 / 5" in failed
    assert "app.Boom: card declined" in failed and "second line" not in failed
    assert "in 5 min" in row_of(response, states["pending_later"])
    assert "overdue 2 h" in row_of(response, states["pending_due"])
    assert "lease ends in 40 s" in row_of(response, states["running"])
    assert "0 / 5" in row_of(response, states["pending_due"])


def test_attempts_column_uses_the_message_cap(admin_client):
    message = MessageFactory(max_attempts=9, attempt_count=2)
    assert "2 / 9" in row_of(admin_client.get(CHANGELIST), message)


def test_long_errors_are_cut_with_the_full_line_in_the_title(admin_client):
    message = MessageFactory(last_error="E: " + "x" * 200)
    row = row_of(admin_client.get(CHANGELIST), message)
    assert "…" in row and 'title="E: ' + "x" * 200 + '"' in row


def test_the_key_cell_links_to_the_message_and_shows_its_queue_kind_and_group(admin_client):
    message = MessageFactory(key="order-7", kind="billing.Invoice", group="customer-3")
    row = row_of(admin_client.get(f"{CHANGELIST}?queue=default"), message)
    # To the change page, the filters kept for the way back, as the id's link.
    link = f"{CHANGELIST}{message.pk}/change/?_changelist_filters=queue%3Ddefault"
    assert f'<a class="dq-key" href="{link}" title="order-7">order-7</a>' in row
    assert row.count(f'href="{link}"') == 2
    assert ">default · billing.Invoice</span>" in row
    assert 'href="?queue=default&amp;group=customer-3">customer-3</a>' in row


def test_in_a_popup_the_key_hands_the_message_to_the_opener(admin_client):
    message = MessageFactory(key="order-8")
    html = admin_client.get(f"{CHANGELIST}?_popup=1&_to_field=id").content.decode()
    # The id's link and the key's both.
    assert html.count(f'data-popup-opener="{message.pk}"') == 2
    assert f'data-popup-opener="{message.pk}" title="order-8">order-8</a>' in html


def test_status_attempts_and_created_are_compact_with_the_whole_in_titles(admin_client):
    message = MessageFactory(attempt_count=2, max_attempts=4)
    row = row_of(admin_client.get(CHANGELIST), message)
    assert 'title="2 attempts of at most 4">2 / 4</span>' in row
    created = local_time(message.created_at)
    assert f'<span class="dq-when" title="{created}">' in row


def test_newest_messages_first(admin_client):
    first, second = MessageFactory(), MessageFactory()
    assert listed(admin_client.get(CHANGELIST)) == [second.pk, first.pk]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status__exact=failed", ["failed"]),
        ("status__exact=pending", ["pending_due", "pending_later"]),
        ("queue=orders", ["running", "failed"]),
        ("overdue=60", ["pending_due"]),
        ("overdue=86400", []),
    ],
)
def test_filters(admin_client, states, query, expected):
    response = admin_client.get(f"{CHANGELIST}?{query}")
    assert response.status_code == 200
    assert sorted(listed(response)) == sorted(states[name].pk for name in expected)


def test_kind_filter_and_messages_without_a_kind(admin_client):
    typed = MessageFactory(kind="email.welcome")
    plain = MessageFactory(kind="")
    assert listed(admin_client.get(f"{CHANGELIST}?kind=email.welcome")) == [typed.pk]
    assert listed(admin_client.get(f"{CHANGELIST}?kind=")) == [plain.pk]


def test_retrying_filter_lists_pending_messages_after_a_failure(admin_client, fake_clock):
    retrying = MessageFactory(attempt_count=1, last_error="x", next_attempt_time=fake_clock())
    MessageFactory(attempt_count=0)
    MessageFactory(status="failed", attempt_count=3, next_attempt_time=None)
    assert listed(admin_client.get(f"{CHANGELIST}?retrying=yes")) == [retrying.pk]


def test_overdue_filter_includes_expired_leases_but_not_held_ones(admin_client, fake_clock):
    now = fake_clock()
    expired = MessageFactory(status="running", next_attempt_time=now - timedelta(minutes=10))
    MessageFactory(status="running", next_attempt_time=now + timedelta(minutes=10))
    MessageFactory(next_attempt_time=now - timedelta(seconds=30))
    assert listed(admin_client.get(f"{CHANGELIST}?overdue=300")) == [expired.pk]


def test_redelivered_filter(admin_client):
    again = MessageFactory(attempt_count=2)
    once = MessageFactory(attempt_count=1)
    never = MessageFactory(attempt_count=0)
    assert listed(admin_client.get(f"{CHANGELIST}?redelivered=yes")) == [again.pk]
    assert sorted(listed(admin_client.get(f"{CHANGELIST}?redelivered=no"))) == sorted(
        [once.pk, never.pk]
    )


def test_ticks_filter_hides_the_ticks_not_due_yet_or_shows_only_ticks(admin_client, fake_clock):
    now = fake_clock()
    later = [
        MessageFactory(
            key=f"cron:beat:0123456789:T{i}", next_attempt_time=now + timedelta(minutes=5 * i)
        )
        for i in (1, 2, 3)
    ]
    due_tick = MessageFactory(key="cron:beat:0123456789:T0", next_attempt_time=now)
    done_tick = MessageFactory(key="cron:beat:0123456789:T-1", status="succeeded")
    delayed = MessageFactory(key="welcome-1", next_attempt_time=now + timedelta(hours=1))
    shown = listed(admin_client.get(f"{CHANGELIST}?ticks=due"))
    assert sorted(shown) == sorted([due_tick.pk, done_tick.pk, delayed.pk])
    only = listed(admin_client.get(f"{CHANGELIST}?ticks=only"))
    assert sorted(only) == sorted([due_tick.pk, done_tick.pk, *(m.pk for m in later)])
    assert len(listed(admin_client.get(CHANGELIST))) == 6


def test_a_bad_filter_value_is_refused(admin_client):
    response = admin_client.get(f"{CHANGELIST}?overdue=soon")
    assert response.status_code == 302 and "e=1" in response["Location"]


@pytest.mark.parametrize(
    "query",
    [
        "overdue=99999999999",  # now - that many seconds: before the year 1
        "overdue=99999999999999999999999",  # no timedelta holds it
        "overdue=%C2%B2",
        # PostgreSQL's text cannot hold NUL, not even as a parameter.
        "queue=a%00b",
        "kind=a%00b",
        "status__exact=a%00b",
        "q=a%00b",
    ],
)
def test_a_filter_value_no_column_can_hold_is_refused(admin_client, query):
    MessageFactory()
    response = admin_client.get(f"{CHANGELIST}?{query}")
    assert response.status_code == 302 and "e=1" in response["Location"]


def test_queue_and_kind_choices_come_from_the_table_and_the_handlers(admin_client):
    MessageFactory(queue="zeta", kind="k.one")
    MessageFactory(queue="alpha", kind="k.two")
    response = admin_client.get(CHANGELIST)
    html = response.content.decode()
    for value in ("?queue=zeta", "?queue=alpha", "?queue=default", "?kind=k.one", "?kind=k.two"):
        assert f'href="{value}"' in html
    # "default" comes from tests/testapp/handlers.py even without messages in it.


def test_filter_choices_do_not_scan_the_table(admin_client):
    MessageFactory(queue="emails", kind="k")
    with CaptureQueriesContext(connection) as ctx:
        admin_client.get(CHANGELIST)
    sql = [q["sql"] for q in ctx.captured_queries if "django_delayq_message" in q["sql"]]
    distinct = [s for s in sql if "DISTINCT" in s.upper()]
    if connection.vendor == "mysql":
        # MariaDB/MySQL answer DISTINCT from an index alone: a loose index
        # scan ("Using index for group-by") once the table is large, a
        # covering index scan ("Using index") on a table this small.
        assert len(distinct) == 2
        for statement in distinct:
            with connection.cursor() as cursor:
                cursor.execute(f"EXPLAIN {statement}")
                plan = " ".join(str(cell) for row in cursor.fetchall() for cell in row)
            assert "Using index" in plan, plan
    else:
        assert not distinct
    assert not [s for s in sql if re.search(r"\b(MIN|MAX)\(", s.upper())]


def test_distinct_values_are_sorted_and_skip_the_empty_kind():
    for queue, kind in [("b", "x"), ("a", ""), ("b", "y"), ("c", "x")]:
        MessageFactory(queue=queue, kind=kind)
    assert queries.distinct_values("queue") == ["a", "b", "c"]
    assert queries.distinct_values("kind") == ["x", "y"]
    assert queries.distinct_values("queue", limit=2) == ["a", "b"]
    with pytest.raises(ValueError):
        queries.distinct_values("key")


def test_no_count_of_the_whole_table(admin_client, monkeypatch):
    monkeypatch.setattr(message_admin.MessageAdmin, "list_per_page", 2)
    MessageFactory.create_batch(3, kind="x")
    for url in (CHANGELIST, f"{CHANGELIST}?status__exact=pending", f"{CHANGELIST}?q=x"):
        with CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(url).status_code == 200
        counts = [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()]
        assert counts, url
        assert all("LIMIT" in sql.upper() for sql in counts), counts


def test_counts_over_the_cap_say_more_than(admin_client, monkeypatch):
    monkeypatch.setattr(MessagePaginator, "CAP", 3)
    monkeypatch.setattr(message_admin.MessageAdmin, "list_per_page", 2)
    MessageFactory.create_batch(5)
    html = admin_client.get(f"{CHANGELIST}?status__exact=pending").content.decode()
    assert "more than 3 messages" in html
    assert "Select all more than 3 messages" in html


def test_a_big_unfiltered_table_shows_the_estimate_without_counting(admin_client, monkeypatch):
    monkeypatch.setattr(queries, "estimated_count", lambda using=None: 2_345_678)
    MessageFactory.create_batch(2)
    with CaptureQueriesContext(connection) as ctx:
        html = admin_client.get(CHANGELIST).content.decode()
    assert "about 2,300,000 messages" in html
    assert not [q for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()]


def test_postgresql_estimate_comes_from_the_statistics():
    if connection.vendor != "postgresql":
        if connection.vendor == "sqlite":
            assert queries.estimated_count() is None
        return
    MessageFactory.create_batch(20)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_delayq_message")
    assert queries.estimated_count() == 20


@pytest.mark.django_db(transaction=True)
def test_mysql_estimate_comes_from_innodb_statistics():
    if connection.vendor != "mysql":
        pytest.skip("InnoDB's table statistics are MariaDB's and MySQL's")
    MessageFactory.create_batch(20)
    with connection.cursor() as cursor:
        # Commits: ANALYZE TABLE is a statement MySQL runs outside transactions.
        cursor.execute("ANALYZE TABLE django_delayq_message")
    assert queries.estimated_count() == 20


def test_the_list_leaves_payload_and_traceback_in_the_database(admin_client):
    MessageFactory(payload={"big": "x" * 1000}, last_traceback="tb")
    with CaptureQueriesContext(connection) as ctx:
        admin_client.get(CHANGELIST)
    table = qn("django_delayq_message")
    selects = [
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"].startswith(f"SELECT {table}.") and f"{table}.{qn('key')}" in q["sql"]
    ]
    assert selects
    assert all(qn("payload") not in s and qn("last_traceback") not in s for s in selects)


def test_no_facet_counts(admin_client):
    assert "_facets" not in admin_client.get(CHANGELIST).content.decode()


def test_date_hierarchy_offers_the_days_between_the_oldest_and_newest(admin_client, fake_clock):
    now = fake_clock()
    old = MessageFactory()
    Message.objects.filter(pk=old.pk).update(created_at=now - timedelta(days=40))
    new = MessageFactory()
    Message.objects.filter(pk=new.pk).update(created_at=now)
    html = admin_client.get(CHANGELIST).content.decode()
    assert 'class="toplinks"' in html
    assert f"created_at__year={now.year}" in html
    day = now - timedelta(days=40)
    response = admin_client.get(
        f"{CHANGELIST}?created_at__year={day.year}&created_at__month={day.month}"
        f"&created_at__day={day.day}"
    )
    assert listed(response) == [old.pk]


def test_date_hierarchy_with_an_empty_table(admin_client):
    assert 'class="toplinks"' not in admin_client.get(CHANGELIST).content.decode()


def test_object_tools_registered_by_other_modules(admin_client, monkeypatch):
    monkeypatch.setattr(
        message_admin, "OBJECT_TOOLS", [("Queue board", "django_delayq_message_changelist")]
    )
    html = admin_client.get(CHANGELIST).content.decode()
    assert f'<a href="{CHANGELIST}">Queue board</a>' in html


def test_extra_urls_come_before_the_admin_catch_all(monkeypatch, rf, admin_user):
    from django.http import HttpResponse
    from django.urls import resolve

    calls = []

    def board(request, model_admin, **kwargs):
        calls.append(model_admin)
        return HttpResponse("board")

    monkeypatch.setattr(message_admin, "EXTRA_URLS", [])
    monkeypatch.setattr(message_admin, "OBJECT_TOOLS", [])
    message_admin.register_view("board/", board, "board", label="Board")
    model_admin = message_admin.MessageAdmin(Message, admin.site)
    patterns = model_admin.get_urls()
    assert patterns[0].name == "django_delayq_message_board"
    assert message_admin.OBJECT_TOOLS == [("Board", "django_delayq_message_board")]
    request = rf.get("/board/")
    request.user = admin_user
    assert patterns[0].callback(request).content == b"board"
    assert calls == [model_admin]
    # The real URLconf still routes the object pages.
    assert resolve(f"{CHANGELIST}1/operation/cancel/").url_name == (
        "django_delayq_message_operation"
    )


def sortable(response) -> set[str]:
    return set(re.findall(r'class="sortable column-(\w+)', response.content.decode()))


def test_only_cheap_orderings_are_offered(admin_client, states):
    assert sortable(admin_client.get(CHANGELIST)) == {"id", "status_display"}
    narrowed = admin_client.get(f"{CHANGELIST}?status__exact=pending")
    assert sortable(narrowed) == {"id", "status_display", "next_attempt", "priority"}


def test_pending_messages_by_next_attempt(admin_client, states):
    # The column's index, after the action checkbox.
    column = ["action_checkbox", *message_admin.MessageAdmin.list_display].index("next_attempt")
    response = admin_client.get(f"{CHANGELIST}?status__exact=pending&o={column}")
    assert listed(response) == [states["pending_due"].pk, states["pending_later"].pk]


def test_a_result_that_fits_on_one_page_is_read_once(admin_client):
    MessageFactory.create_batch(3, payload={"a": 1})
    MessageFactory(payload={"a": 2})
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(f"{CHANGELIST}?q=a%3D1")
    assert len(listed(response)) == 3
    searches = [q["sql"] for q in ctx.captured_queries if qn("payload") in q["sql"]]
    assert len(searches) == 1, searches


def test_a_result_over_one_page_is_counted(admin_client, monkeypatch):
    monkeypatch.setattr(message_admin.MessageAdmin, "list_per_page", 2)
    MessageFactory.create_batch(5)
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(f"{CHANGELIST}?status__exact=pending")
    assert response.context["cl"].result_count == 5
    assert len(listed(response)) == 2
    filtered = [q for q in ctx.captured_queries if f"{qn('status')} = 'pending'" in q["sql"]]
    assert len(filtered) == 2  # the first page (also counted) and the capped count
    assert "5 messages" in response.content.decode()
    page3 = admin_client.get(f"{CHANGELIST}?status__exact=pending&p=3")
    assert len(listed(page3)) == 1
