"""Which database the queue lives on: queue_alias, DelayQRouter, checks E090 and E091."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db.utils import ConnectionRouter
from django.test import override_settings

from django_delayq import routers
from django_delayq.checks import check_queue_database
from django_delayq.models import Message, QueueState, WorkerState
from django_delayq.routers import DelayQRouter, queue_alias

PACKAGE = Path(__file__).resolve().parents[2] / "django_delayq"
# Another alias of the test settings, when there is one: else default.
OTHER = "queue" if "queue" in settings.DATABASES else "default"


class Elsewhere:
    """A project router that sends every model to one alias."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_read(self, model, **hints):
        return self.alias

    def db_for_write(self, model, **hints):
        return self.alias


def routed(monkeypatch, *routers_: object) -> None:
    monkeypatch.setattr(routers, "router", ConnectionRouter(list(routers_)))


def ids(**delayq) -> list[str]:
    with override_settings(DELAYQ=delayq):
        return [e.id for e in routers.routing_problems()]


class ProjectModelsOn:
    """A project router that puts the test app's models on one alias."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_write(self, model, **hints):
        return self.alias if model._meta.app_label == "testapp" else None


def test_an_explicit_alias_wins_over_the_setting_and_the_routers(monkeypatch):
    routed(monkeypatch, Elsewhere("nowhere"))
    with override_settings(DELAYQ={"DATABASE": OTHER}):
        assert queue_alias("default") == "default"
        assert queue_alias() == OTHER
        assert queue_alias(read=True) == OTHER


def test_without_the_setting_the_routers_decide(monkeypatch):
    routed(monkeypatch, Elsewhere(OTHER))
    with override_settings(DELAYQ={}):
        assert queue_alias() == OTHER
    routed(monkeypatch)
    with override_settings(DELAYQ={}):
        assert queue_alias() == "default"


def test_an_alias_not_in_databases_is_refused_before_any_query():
    with override_settings(DELAYQ={"DATABASE": "nowhere"}):
        with pytest.raises(ImproperlyConfigured, match="'nowhere' is not in DATABASES"):
            queue_alias()
    with pytest.raises(ImproperlyConfigured, match="'nowhere' is not in DATABASES"):
        queue_alias("nowhere")


def test_the_router_routes_the_queue_models_only():
    router = DelayQRouter()
    with override_settings(DELAYQ={"DATABASE": OTHER}):
        for model in (Message, QueueState, WorkerState):
            assert router.db_for_read(model) == OTHER
            assert router.db_for_write(model) == OTHER
        assert router.db_for_write(User) is None
        assert router.allow_migrate(OTHER, "django_delayq", "message") is True
        assert router.allow_migrate("elsewhere", "django_delayq", "message") is False
        assert router.allow_migrate("elsewhere", "auth", "user") is None
        assert router.allow_relation(Message(), QueueState()) is True
        assert router.allow_relation(Message(), User()) is None


def test_without_the_setting_the_router_has_no_opinion():
    router = DelayQRouter()
    with override_settings(DELAYQ={}):
        assert router.db_for_write(Message) is None
        assert router.allow_migrate("default", "django_delayq", "message") is None


def test_the_setting_with_the_router_passes(monkeypatch):
    routed(monkeypatch, DelayQRouter())
    assert ids(DATABASE=OTHER) == []
    assert ids() == []


@pytest.mark.parametrize("value", ["nowhere", 3, ""])
def test_a_database_that_is_no_alias_is_e080(value):
    assert ids(DATABASE=value) == ["django_delayq.E090"]


def test_routers_that_disagree_with_the_setting_are_e081(monkeypatch):
    routed(monkeypatch, Elsewhere("nowhere"))
    with override_settings(DELAYQ={"DATABASE": OTHER}):
        (error,) = check_queue_database()
    assert error.id == "django_delayq.E091"
    assert "Message: db_for_write is 'nowhere'" in error.msg
    assert "django_delayq.routers.DelayQRouter" in error.hint


def test_a_router_that_moves_the_tables_elsewhere_is_e081(monkeypatch):
    class NoMigrate:
        def allow_migrate(self, db, app_label, **hints):
            return False

    routed(monkeypatch, DelayQRouter(), NoMigrate())
    # DelayQRouter comes first and allows the queue's alias: nothing to report.
    assert ids(DATABASE=OTHER) == []
    routed(monkeypatch, NoMigrate(), DelayQRouter())
    assert ids(DATABASE=OTHER) == ["django_delayq.E091"]


# Django 6's manage.py check runs the database checks too (the JSON field's asks
# the connection), so it needs the database as a user's check does.
@pytest.mark.django_db
def test_a_bad_database_fails_manage_check():
    with (
        override_settings(DELAYQ={"DATABASE": "nowhere"}),
        pytest.raises(SystemCheckError, match="E090"),
    ):
        call_command("check")


def test_no_module_asks_the_routers_for_the_queue_itself():
    """Every path reads the alias through queue_alias (explicit, then the setting, then routers).

    A call of ``router.db_for_write(Message)`` elsewhere would ignore
    ``DELAYQ["DATABASE"]``; the project's models with queue columns
    (``entity.py``) are the project's routers' business.
    """
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "routers.py" or "migrations" in path.parts or path.name == "entity.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("db_for_read", "db_for_write")
                and isinstance(node.value, ast.Name)
                and node.value.id == "router"
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []


def test_a_model_queue_written_on_another_database_is_w080(monkeypatch):
    routed(monkeypatch, DelayQRouter(), ProjectModelsOn("nowhere"))
    with override_settings(DELAYQ={"DATABASE": OTHER}):
        found = check_queue_database()
    shipments = [w for w in found if w.msg.startswith("testapp.Shipment ")]
    assert [w.id for w in shipments] == ["django_delayq.W090"]
    assert "written on database 'nowhere', but workers claim its rows" in shipments[0].msg
    assert shipments[0].msg.endswith(f"on the queue's database {OTHER!r}")
    routed(monkeypatch, DelayQRouter(), ProjectModelsOn(OTHER))
    with override_settings(DELAYQ={"DATABASE": OTHER}):
        assert check_queue_database() == []
