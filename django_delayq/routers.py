"""Which database the queue's tables live on.

The queue (``Message`` and the app's other models: queue, flow and worker
state) lives on one database alias: ``'default'`` unless ``DELAYQ["DATABASE"]``
or a database router says otherwise. Every function of the app that touches
those tables asks :func:`queue_alias`, so an explicit ``using=`` (or
``--database``) wins, then the setting, then the project's routers.

The setting alone does not move Django's own paths (the admin, the default
manager, ``migrate``): they ask the routers. :class:`DelayQRouter`, added to
``DATABASE_ROUTERS``, makes them follow ``DELAYQ["DATABASE"]`` too, and the
system check ``django_delayq.E091`` says when the routers disagree with it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import router
from django.db.models import Model

from django_delayq.conf import get_config

APP_LABEL = "django_delayq"


def configured_alias() -> str | None:
    """``DELAYQ["DATABASE"]``, or None when the routers decide."""
    value = get_config().get("DATABASE")
    return value if isinstance(value, str) and value else None


def queue_alias(using: str | None = None, *, read: bool = False) -> str:
    """The database alias of the queue's tables.

    ``using`` when given, else ``DELAYQ["DATABASE"]``, else what the routers
    say for ``Message`` (``db_for_read`` when ``read``, so reports may go to
    a replica a router names). An alias that is not in ``DATABASES`` is an
    ``ImproperlyConfigured`` here, before any query, rather than a
    ``ConnectionDoesNotExist`` from deep inside a worker.
    """
    alias = using or configured_alias()
    if alias is None:
        from django_delayq.models import Message

        return router.db_for_read(Message) if read else router.db_for_write(Message)
    if alias not in settings.DATABASES:
        known = ", ".join(repr(a) for a in settings.DATABASES)
        raise ImproperlyConfigured(
            f"database {alias!r} is not in DATABASES (known aliases: {known})"
        )
    return alias


def model_alias(model: type[Model], using: str | None = None, *, read: bool = False) -> str:
    """The alias for ``model``'s rows: :func:`queue_alias` for the app's own
    models, the routers' choice for a project's model with queue columns."""
    if _is_queue_model(model):
        return queue_alias(using, read=read)
    if using:
        return using
    return router.db_for_read(model) if read else router.db_for_write(model)


def _is_queue_model(model: type[Model] | None) -> bool:
    return model is not None and model._meta.app_label == APP_LABEL


class DelayQRouter:
    """Route the queue's models to ``DELAYQ["DATABASE"]``; leave every other model alone.

    Add it to ``DATABASE_ROUTERS`` (before routers that would claim every
    model) so that the admin, the default manager (``Message.objects``) and
    ``migrate`` follow the setting: the tables are created on that database
    only. With ``DELAYQ["DATABASE"]`` unset it has no opinion.

    The app's models cover ``Message``, the queue, flow and worker state,
    not the project's own models with queue columns (``QueueFields``): those
    stay where the project's routers put them.
    """

    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return configured_alias() if _is_queue_model(model) else None

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        return configured_alias() if _is_queue_model(model) else None

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool | None:
        if configured_alias() is None:
            return None
        if _is_queue_model(type(obj1)) and _is_queue_model(type(obj2)):
            return True
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        alias = configured_alias()
        if alias is None or app_label != APP_LABEL:
            return None
        return db == alias


def routing_problems() -> list[Any]:
    """``DELAYQ["DATABASE"]`` names no alias (E090), or the routers send the queue elsewhere (E091).

    Without :class:`DelayQRouter` (or a router of the project's that agrees),
    the admin and ``Message.objects`` would read the queue on another
    database than the one enqueue writes to, and ``migrate`` would create the
    tables there: a mismatch found at start-up instead of as missing rows.
    """
    from django.apps import apps
    from django.core.checks import Error

    value = get_config().get("DATABASE")
    if value is None:
        return []
    if not isinstance(value, str) or value not in settings.DATABASES:
        known = ", ".join(repr(a) for a in settings.DATABASES)
        return [
            Error(
                f"DELAYQ['DATABASE'] must be an alias of DATABASES or None, got {value!r}",
                hint=f"known aliases: {known}",
                id="django_delayq.E090",
            )
        ]
    wrong = []
    for model in apps.get_app_config(APP_LABEL).get_models():
        found = {
            "db_for_write": router.db_for_write(model),
            "db_for_read": router.db_for_read(model),
        }
        wrong += [
            f"{model.__name__}: {name} is {db!r}" for name, db in found.items() if db != value
        ]
        if not router.allow_migrate_model(value, model):
            wrong.append(f"{model.__name__}: allow_migrate({value!r}) is False")
    if not wrong:
        return []
    return [
        Error(
            f"DELAYQ['DATABASE'] is {value!r} but the database routers disagree: "
            + "; ".join(wrong),
            hint="add 'django_delayq.routers.DelayQRouter' to DATABASE_ROUTERS, "
            "before routers that route every model",
            id="django_delayq.E091",
        )
    ]


def model_queue_problems() -> list[Any]:
    """Models of ``@handler(..., model=...)`` whose rows the routers keep elsewhere (W090).

    Workers claim every queue on the queue's database: the rows of a model
    the project writes on another alias would never be claimed there (or a
    stale copy of its table would be), so the model must live with the queue.
    """
    from django.core.checks import Warning

    from django_delayq.registry import registry

    try:
        alias = queue_alias()
    except ImproperlyConfigured:
        return []  # E090 says why
    problems = []
    for spec in registry.all():
        model = spec.model
        if model is None:
            continue
        where = router.db_for_write(model)
        if where != alias:
            problems.append(
                Warning(
                    f"{model._meta.label} (queue {spec.queue!r}) is written on database "
                    f"{where!r}, but workers claim its rows on the queue's database {alias!r}",
                    hint=f"route the model to the queue's database, or keep the queue on {where!r}",
                    obj=model,
                    id="django_delayq.W090",
                )
            )
    return problems
