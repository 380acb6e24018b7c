"""The admin's search syntax, parsed without a database."""

from datetime import timedelta

import pytest

from django_delayq.admin.actions import parse_delay
from django_delayq.admin.display import span
from django_delayq.search import FieldTerm, parse, parse_value


def test_plain_words_and_quoted_phrases_are_text_terms():
    parsed = parse("order-42 \"connection refused\"  'smtp down'")
    assert parsed.words == ["order-42", "connection refused", "smtp down"]
    assert parsed.fields == []
    assert not parsed.errors


def test_field_term_with_an_integer_matches_the_number_and_its_string_form():
    assert parse("companyId=3345").fields == [FieldTerm(("companyId",), (3345, "3345"))]


def test_dotted_path_goes_into_nested_objects():
    assert parse("customer.id=7").fields == [FieldTerm(("customer", "id"), (7, "7"))]


def test_several_terms_are_kept_in_order():
    parsed = parse("companyId=3345 status=new urgent")
    assert parsed.fields == [
        FieldTerm(("companyId",), (3345, "3345")),
        FieldTerm(("status",), ("new",)),
    ]
    assert parsed.words == ["urgent"]


@pytest.mark.parametrize(
    ("raw", "values"),
    [
        ("12", (12, "12")),
        ("-3", (-3, "-3")),
        ("1.5", (1.5, "1.5")),
        ("2e3", (2000.0, "2e3")),
        ("true", (True, "true")),
        ("false", (False, "false")),
        ("null", (None, "null")),
        ("new", ("new",)),
        ("007x", ("007x",)),
        ("", ("",)),
        ("99999999999999999999", ("99999999999999999999",)),
    ],
)
def test_unquoted_values_are_typed_and_also_match_their_string_form(raw, values):
    assert parse_value(raw) == values


def test_quoted_values_are_exact_strings_with_spaces():
    parsed = parse('name="Jane Doe" code=\'007\' flag="true"')
    assert parsed.fields == [
        FieldTerm(("name",), ("Jane Doe",)),
        FieldTerm(("code",), ("007",)),
        FieldTerm(("flag",), ("true",)),
    ]


def test_an_unterminated_quote_runs_to_the_end():
    assert parse('name="Jane Doe').fields == [FieldTerm(("name",), ("Jane Doe",))]


def test_list_indexes_and_dashes_are_allowed_in_paths():
    assert parse("items.0.sku=A1 order-id=5").fields == [
        FieldTerm(("items", "0", "sku"), ("A1",)),
        FieldTerm(("order-id",), (5, "5")),
    ]


@pytest.mark.parametrize(
    "term",
    [
        "a;b=1",
        "a..b=1",
        ".a=1",
        "a__b=1",
        "x)OR(1=1",
        "ключ=1",
    ],
)
def test_unsafe_paths_are_ignored_and_reported(term):
    parsed = parse(term)
    assert parsed.fields == []
    assert len(parsed.errors) == 1
    assert "ignored" in parsed.errors[0]


def test_a_term_with_quotes_before_the_equals_sign_is_searched_as_text():
    parsed = parse("payload->>'x'=1")
    assert parsed.fields == []
    assert parsed.words == ["payload->>'x'=1"]


def test_empty_search_is_falsy():
    assert not parse("")
    assert not parse("   ")
    assert parse("x")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90", timedelta(seconds=90)),
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("15 min", timedelta(minutes=15)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1d 2h", timedelta(days=1, hours=2)),
    ],
)
def test_delays_in_the_reschedule_form(text, expected):
    assert parse_delay(text) == expected


@pytest.mark.parametrize("text", ["", "soon", "1w", "-5m", "1.5h"])
def test_bad_delays_are_refused(text):
    with pytest.raises(ValueError, match="not a delay"):
        parse_delay(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (59, "59 s"), (60, "1 min"), (3599, "59 min"), (7200, "2 h"), (90000, "1 d")],
)
def test_relative_spans(seconds, text):
    assert span(timedelta(seconds=seconds)) == text
    assert span(-timedelta(seconds=seconds)) == text
