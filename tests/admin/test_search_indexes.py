"""The opt-in search indexes: the search's SQL uses them, and their migration
applies and reverses on every database (it builds nothing outside PostgreSQL)."""

from urllib.parse import urlencode

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from django_delayq import search
from django_delayq.contrib.search_indexes import indexes
from django_delayq.models import Message
from tests.admin.message_pages import CHANGELIST, listed
from tests.factories import MessageFactory

NAMES = {index.name for index in indexes.INDEXES}
on_postgresql = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="the indexes and the planner are PostgreSQL's"
)


def search_rows() -> dict[str, Message]:
    return {
        "keyed": MessageFactory(key="k-424242", queue="orders", kind="orders.v2"),
        "longer": MessageFactory(key="k-4242420", queue="emails"),
        "grouped": MessageFactory(group="k-424242-group", queue="emails"),
        "errored": MessageFactory(last_error="Timeout for k-424242 at the gateway"),
        "payload": MessageFactory(payload={"companyId": 3345, "customer": {"id": 7}}),
        "text": MessageFactory(payload={"companyId": "3345"}),
        "other": MessageFactory(key="k-1", payload={"companyId": 1}, last_error="boom"),
    }


def found(q: str) -> set[int]:
    return set(search.apply(Message.objects.all(), q).values_list("pk", flat=True))


def plan(q: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # the table is small
    return str(search.apply(Message.objects.all(), q).explain())


@on_postgresql
@pytest.mark.django_db
def test_a_word_is_found_from_indexes_alone() -> None:
    search_rows()
    indexes.create(connection, Message, concurrently=False)  # rolled back with the test
    words = plan("k-424242")
    # Key, group and error branches from the search indexes, the queue and
    # kind branches (no value holds the word: left out), one bitmap OR.
    for name in ("delayq_search_key_idx", "delayq_search_group_idx", "delayq_search_error_idx"):
        assert name in words, words
    assert "Seq Scan" not in words and "BitmapOr" in words, words
    queue_and_kind = plan("orders")
    assert "delayq_message_queue_key" in queue_and_kind, queue_and_kind  # queue IN ('orders')
    assert "delayq_kind_idx" in queue_and_kind, queue_and_kind  # kind IN ('orders.v2')
    assert "Seq Scan" not in queue_and_kind, queue_and_kind


@on_postgresql
@pytest.mark.django_db
def test_a_payload_term_is_found_from_the_gin_index() -> None:
    search_rows()
    indexes.create(connection, Message, concurrently=False)
    for q in ("companyId=3345", "customer.id=7"):
        payload = plan(q)
        assert "delayq_search_payload_idx" in payload and "Seq Scan" not in payload, payload


@on_postgresql
@pytest.mark.django_db
def test_the_indexes_change_no_result() -> None:
    rows = search_rows()
    queries = [
        "k-424242",
        "K-424242",
        "k-4242",
        "companyId=3345",
        "gateway",
        "orders",
        "k-424242 companyId=1",
    ]
    without = {q: found(q) for q in queries}
    indexes.create(connection, Message, concurrently=False)
    assert {q: found(q) for q in queries} == without
    assert without["k-424242"] == {
        rows[name].pk for name in ("keyed", "longer", "grouped", "errored")
    }
    assert without["companyId=3345"] == {rows["payload"].pk, rows["text"].pk}


@pytest.mark.django_db
def test_words_find_keys_groups_errors_queues_and_kinds(admin_client) -> None:
    rows = search_rows()

    def on_page(q: str) -> set[int]:
        response = admin_client.get(f"{CHANGELIST}?{urlencode({'q': q})}")
        assert response.status_code == 200
        return set(listed(response))

    assert on_page("k-424242") == {
        rows[name].pk for name in ("keyed", "longer", "grouped", "errored")
    }
    assert on_page("k-4242420") == {rows["longer"].pk}
    assert on_page("424242-group") == set()  # a group matches by prefix only
    assert on_page("GATEWAY") == {rows["errored"].pk}
    assert on_page("V2") == {rows["keyed"].pk}  # kind, any case
    assert on_page("Mail") == {rows["longer"].pk, rows["grouped"].pk}  # queue, any case


@pytest.mark.django_db
def test_queues_too_many_to_list_are_searched_in_the_table(admin_client) -> None:
    for i in range(search._VALUES_LIMIT + 1):
        MessageFactory(queue=f"q{i:03d}")
    hooked = MessageFactory(queue="WebHooks")
    assert search.listed_values("queue", "default") is None
    response = admin_client.get(f"{CHANGELIST}?{urlencode({'q': 'webhook'})}")
    assert set(listed(response)) == {hooked.pk}


@pytest.mark.django_db(transaction=True)
def test_the_migration_builds_the_indexes_and_reverses() -> None:
    apps = [*settings.INSTALLED_APPS, "django_delayq.contrib.search_indexes"]
    with override_settings(INSTALLED_APPS=apps):
        call_command("migrate", "delayq_search_indexes", verbosity=0)
        built = valid_search_indexes()
        call_command("migrate", "delayq_search_indexes", "zero", verbosity=0)
        left = valid_search_indexes()
    assert built == (NAMES if connection.vendor == "postgresql" else set())
    assert left == set()


def valid_search_indexes() -> set[str]:
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            found = connection.introspection.get_constraints(cursor, Message._meta.db_table)
        return NAMES & set(found)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indisvalid AND c.relname = ANY(%s)",
            [sorted(NAMES)],
        )
        return {row[0] for row in cursor.fetchall()}
