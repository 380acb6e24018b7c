"""The changelist's search box: payload fields and words, on every database."""

from urllib.parse import urlencode

import pytest
from django.db import connection

from django_delayq import search
from django_delayq.models import Message
from tests.admin.message_pages import CHANGELIST, listed, notes
from tests.admin.staff import staff_client
from tests.factories import MessageFactory

pytestmark = pytest.mark.django_db


def found(client, q) -> set[int]:
    response = client.get(f"{CHANGELIST}?{urlencode({'q': q})}")
    assert response.status_code == 200
    return set(listed(response))


def pks(*messages) -> set[int]:
    return {m.pk for m in messages}


def test_payload_number_matches_the_number_and_its_string_form(admin_client):
    number = MessageFactory(payload={"companyId": 3345})
    text = MessageFactory(payload={"companyId": "3345"})
    MessageFactory(payload={"companyId": 33450})
    MessageFactory(payload={"otherId": 3345})
    MessageFactory(payload={"company": {"companyId": 3345}})
    assert found(admin_client, "companyId=3345") == pks(number, text)


def test_nested_payload_field(admin_client):
    nested = MessageFactory(payload={"customer": {"id": 7, "name": "Jane"}})
    MessageFactory(payload={"id": 7})
    MessageFactory(payload={"customer": {"id": 8}})
    assert found(admin_client, "customer.id=7") == pks(nested)


def test_several_terms_must_all_match(admin_client):
    both = MessageFactory(payload={"companyId": 3345, "status": "new"})
    MessageFactory(payload={"companyId": 3345, "status": "paid"})
    MessageFactory(payload={"companyId": 1, "status": "new"})
    assert found(admin_client, "companyId=3345 status=new") == pks(both)


def test_quoted_values_match_exact_strings(admin_client):
    jane = MessageFactory(payload={"name": "Jane Doe"})
    MessageFactory(payload={"name": "Jane"})
    code = MessageFactory(payload={"code": "007"})
    MessageFactory(payload={"code": 7})
    assert found(admin_client, 'name="Jane Doe"') == pks(jane)
    assert found(admin_client, "code='007'") == pks(code)


def test_booleans_null_floats_and_list_items(admin_client):
    active = MessageFactory(payload={"active": True, "score": 1.5, "items": [{"sku": "A1"}]})
    inactive = MessageFactory(payload={"active": False, "note": None, "items": [{"sku": "B2"}]})
    assert found(admin_client, "active=true") == pks(active)
    assert found(admin_client, "active=false") == pks(inactive)
    assert found(admin_client, "note=null") == pks(inactive)
    assert found(admin_client, "score=1.5") == pks(active)
    assert found(admin_client, "items.0.sku=A1") == pks(active)


def test_a_key_named_like_a_lookup_is_still_a_key(admin_client):
    odd = MessageFactory(payload={"contains": 1, "in": {"lt": "x"}, "exact": [{"isnull": 2}]})
    MessageFactory(payload={"other": 1})
    assert found(admin_client, "contains=1") == pks(odd)
    assert found(admin_client, "in.lt=x") == pks(odd)
    assert found(admin_client, "exact.0.isnull=2") == pks(odd)


def test_words_match_key_prefix_kind_queue_error_and_id(admin_client):
    keyed = MessageFactory(key="order-42-confirm")
    kinded = MessageFactory(kind="email.welcome")
    queued = MessageFactory(queue="webhooks")
    errored = MessageFactory(last_error="ConnectionError: Connection refused by host")
    assert found(admin_client, "order-42") == pks(keyed)
    assert found(admin_client, "42-confirm") == set()  # the key matches by prefix only
    assert found(admin_client, "WELCOME") == pks(kinded)
    assert found(admin_client, "hook") == pks(queued)
    assert found(admin_client, "WebHooks") == pks(queued)  # binary on MariaDB/MySQL too
    assert found(admin_client, '"connection refused"') == pks(errored)
    assert keyed.pk in found(admin_client, str(keyed.pk))


def test_words_of_digits_that_are_not_ids_are_searched_as_words():
    # "²".isdigit() is True but int("²") raises; ids beyond the bigint range
    # must not reach the database as numbers either.
    client = staff_client("searcher", "view_message")[0]
    squared = MessageFactory(key="area-x", kind="m²")
    huge = MessageFactory(key="99999999999999999999-batch", kind="big")
    MessageFactory(key="other", kind="plain")
    assert found(client, "²") == pks(squared)
    assert found(client, "99999999999999999999") == pks(huge)
    assert found(client, "-99999999999999999999") == set()
    assert found(client, "9223372036854775808") == set()
    assert found(client, "9" * 5000) == set()  # int() refuses over 4,300 digits


def test_a_payload_number_no_float_holds_matches_its_string_form():
    client = staff_client("searcher", "view_message")[0]
    text = MessageFactory(payload={"x": "1e999"})
    MessageFactory(payload={"x": 1})
    assert found(client, "x=1e999") == pks(text)
    assert found(client, "x=-1e999") == set()
    assert found(client, "x=" + "9" * 5000) == set()


def test_words_and_payload_terms_combine(admin_client):
    hit = MessageFactory(queue="billing", payload={"companyId": 3})
    MessageFactory(queue="billing", payload={"companyId": 4})
    MessageFactory(queue="emails", payload={"companyId": 3})
    assert found(admin_client, "billing companyId=3") == pks(hit)


def test_a_bad_term_is_ignored_with_a_warning(admin_client):
    hit = MessageFactory(payload={"a": 1})
    response = admin_client.get(f"{CHANGELIST}?{urlencode({'q': 'a=1 x;y=2'})}")
    assert set(listed(response)) == pks(hit)
    assert any("ignored 'x;y=2'" in note for note in notes(response))


def test_injection_attempts_are_plain_values(admin_client):
    MessageFactory(payload={"name": "x"})
    for q in ["name=x'); DROP TABLE django_delayq_message; --", 'name="\' OR 1=1 --"']:
        assert found(admin_client, q) == set()
    assert Message.objects.count() == 1


def test_search_help_text_documents_the_syntax(admin_client):
    html = admin_client.get(CHANGELIST).content.decode()
    assert 'id="searchbar_helptext"' in html
    assert "<code>companyId=3345</code>" in html and "<code>customer.id=7</code>" in html


def test_search_results_show_their_count(admin_client):
    MessageFactory.create_batch(2, payload={"a": 1})
    html = admin_client.get(f"{CHANGELIST}?q=a%3D1").content.decode()
    assert "2 results" in html


def test_postgresql_uses_containment_and_others_key_lookups():
    sql = str(search.apply(Message.objects.all(), "customer.id=7 items.0.sku=A").query)
    if connection.vendor == "postgresql":
        assert "@>" in sql  # a GIN index on payload can serve it
    else:
        assert "@>" not in sql


def test_search_of_payload_fields_from_python():
    hit = MessageFactory(payload={"customer": {"id": 7}})
    MessageFactory(payload={"customer": {"id": 8}})
    assert list(search.apply(Message.objects.all(), "customer.id=7")) == [hit]
    assert search.apply(Message.objects.all(), "").count() == 2
