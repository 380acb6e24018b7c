import pytest

from django_delayq.fingerprint import fingerprint, normalise, split_error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            "tests.testapp.handlers.Boom: attempt 1 of message 5 failed",
            "tests.testapp.handlers.Boom: attempt <n> of message <n> failed",
        ),
        ("ValueError: price 12.50 below 13", "ValueError: price <n> below <n>"),
        (
            "LookupError: order 550e8400-e29b-41d4-a716-446655440000 not found",
            "LookupError: order <uuid> not found",
        ),
        ("RuntimeError: object at 0x7f3a2b9c gone", "RuntimeError: object at <hex> gone"),
        ("RuntimeError: commit 5f3a9c0e1b2d missing", "RuntimeError: commit <hex> missing"),
        ("SMTPError: bob.smith+x@example.co.uk refused", "SMTPError: <email> refused"),
        (
            "ValueError: user 'alice' has no \"billing\" address",
            "ValueError: user '…' has no \"…\" address",
        ),
        # An apostrophe is not a quote.
        ("ValueError: can't parse 'x'", "ValueError: can't parse '…'"),
        ("TimeoutError", "TimeoutError"),
        ("Discarded: no recipient", "Discarded: no recipient"),
    ],
)
def test_normalise_replaces_values_and_keeps_the_type(error, expected):
    assert normalise(error) == expected


def test_a_message_that_is_one_quoted_value_keeps_it():
    """KeyError: 'user_id' and KeyError: 'email' are different bugs."""
    assert normalise("KeyError: 'user_id'") == "KeyError: 'user_id'"
    assert fingerprint("KeyError: 'user_id'") != fingerprint("KeyError: 'email'")
    assert fingerprint("KeyError: 'order-41'") == fingerprint("KeyError: 'order-42'")


def test_same_bug_with_other_values_has_one_fingerprint():
    a = fingerprint("app.PaymentError: card 4242 declined for 'Alice' (order 17)")
    b = fingerprint("app.PaymentError: card 1881 declined for 'Bob' (order 923)")
    assert a == b
    assert len(a) == 32


def test_type_and_wording_tell_groups_apart():
    base = fingerprint("app.PaymentError: card 4242 declined")
    assert base != fingerprint("app.OtherError: card 4242 declined")
    assert base != fingerprint("app.PaymentError: card 4242 expired")
    # The same message text under another exception module is another bug.
    assert base != fingerprint("other.PaymentError: card 4242 declined")


def test_only_the_first_line_counts():
    a = 'UniqueViolation: duplicate key "x_pkey"\nDETAIL:  Key (id)=(5) already exists.'
    b = 'UniqueViolation: duplicate key "x_pkey"\nDETAIL:  Key (slug)=(a-b) already exists.'
    assert fingerprint(a) == fingerprint(b)


def test_no_error_has_no_fingerprint():
    assert fingerprint("") == ""
    assert fingerprint("  \n") == ""


def test_split_error():
    assert split_error("a.B: c: d") == ("a.B", "c: d")
    assert split_error("TimeoutError") == ("TimeoutError", "")
