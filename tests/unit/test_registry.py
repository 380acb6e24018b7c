from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_delayq import handler
from django_delayq.exceptions import HandlerNotFound
from django_delayq.registry import registry


def test_handlers_are_discovered_from_installed_apps():
    assert {"default", "other", "atomic", "slow"} <= set(registry.queues())


def test_kind_specific_handler_wins_over_catch_all():
    assert registry.lookup("default", "typed").func.__name__ == "typed_handler"
    assert registry.lookup("default", "anything").func.__name__ == "default_handler"


def test_unknown_queue_is_not_found():
    with pytest.raises(HandlerNotFound):
        registry.lookup("nope", "")


def test_handler_options_are_validated_at_decoration():
    with pytest.raises(ValueError, match="max_attempts"):
        handler("q1", max_attempts=0)
    with pytest.raises(ValueError, match="max_attempts must be an integer from 1 to 1000000"):
        handler("q1", max_attempts=1_000_001)
    with pytest.raises(ValueError, match="lease"):
        handler("q1", lease=-1)
    with pytest.raises(ValueError, match="lease must be at most 365000 days"):
        handler("q1", lease=10**12)
    with pytest.raises(ValueError, match="time_limit: inf seconds is out of range"):
        handler("q1", time_limit=float("inf"))
    with pytest.raises(ValueError, match="queue name must not be empty"):
        handler("")
    with pytest.raises(ValueError, match="may only hold"):
        handler("emails\n")
    with pytest.raises(ValueError, match="kind contains a NUL"):
        handler("q1", kind="sign\x00up")
    with pytest.raises(TypeError, match="retry policy"):
        handler("q1", retry=object())


def test_two_different_handlers_for_one_queue_are_refused():
    @handler("dup-queue")
    def first(message):
        pass

    try:
        with pytest.raises(ImproperlyConfigured, match="two handlers"):

            @handler("dup-queue")
            def second(message):
                pass
    finally:
        registry.unregister("dup-queue")


def test_options_override_settings():
    spec = registry.lookup("slow", "")
    assert spec.effective_lease() == timedelta(seconds=2)
    assert registry.lookup("other", "").effective_max_attempts() == 2
