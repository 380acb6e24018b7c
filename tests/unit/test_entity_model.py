"""``QueueFields``: what the abstract model gives a project's model, and its check."""

from django.db import models
from django.test.utils import isolate_apps

from django_delayq.checks import check_queue_models
from django_delayq.entity import QueueFields, claim_index
from django_delayq.registry import HandlerSpec, registry
from tests.testapp.models import Shipment


@isolate_apps("tests.testapp")
def test_the_inherited_claim_index_is_named_after_the_model_and_partial():
    class Parcel(QueueFields):
        class Meta(QueueFields.Meta):
            app_label = "testapp"

    (index,) = Parcel._meta.indexes
    assert index.name == "testapp_parcel_dq_claim"
    assert index.fields == ["next_attempt_time"]
    assert index.condition is not None and "pending" in str(index.condition)


def test_a_model_with_a_priority_indexes_it():
    (index,) = Shipment._meta.indexes
    assert (index.name, index.fields) == (
        "testapp_shipment_dq_claim",
        ["-priority", "next_attempt_time"],
    )


def test_rows_describe_themselves_like_messages():
    row = Shipment(pk=7, reference="x")
    assert (row.queue, row.key, row.kind) == ("shipments", "7", "")
    assert row.is_redelivery is False and row.error_summary() == ""


def test_the_registered_models_pass_the_check():
    assert check_queue_models() == []


@isolate_apps("tests.testapp")
def test_a_model_that_dropped_the_index_is_flagged():
    class Parcel(QueueFields):
        class Meta:  # does not inherit QueueFields.Meta
            app_label = "testapp"

    class Indexed(QueueFields):
        priority = models.SmallIntegerField(default=0)

        class Meta:
            app_label = "testapp"
            indexes = [claim_index("indexed_claim", priority=True)]

    class Unsorted(QueueFields):
        priority = models.SmallIntegerField(default=0)

        class Meta(QueueFields.Meta):
            app_label = "testapp"

    models_by_queue = [("parcels", Parcel), ("ix", Indexed), ("unsorted", Unsorted)]
    specs = [HandlerSpec(func=print, queue=q, model=m) for q, m in models_by_queue]
    for spec in specs:
        registry.register(spec)
    try:
        problems = check_queue_models()
    finally:
        for spec in specs:
            registry.unregister(spec.queue)
    assert [(p.id, p.obj) for p in problems] == [
        ("django_delayq.W060", Parcel),
        ("django_delayq.W061", Unsorted),
    ]
    assert "QueueFields.Meta" in problems[0].hint
    assert "priority=True" in problems[1].hint
