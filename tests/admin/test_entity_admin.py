"""``QueueAdminMixin`` on a project's own model: the queue's filters and actions."""

import uuid
from datetime import timedelta

import pytest

from tests.admin.message_pages import action_data, confirm_data, notes
from tests.testapp.models import Shipment

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/testapp/shipment/"


@pytest.fixture
def rows(fake_clock):
    now = fake_clock()
    make = Shipment.objects.create
    return {
        "due": make(reference="due", next_attempt_time=now - timedelta(hours=2)),
        "later": make(reference="later", next_attempt_time=now + timedelta(minutes=5)),
        "retrying": make(
            reference="retrying", attempt_count=1, next_attempt_time=now + timedelta(minutes=1)
        ),
        "running": make(
            reference="running",
            status="running",
            attempt_count=1,
            next_attempt_time=now + timedelta(seconds=40),
            lock_token=uuid.uuid4(),
            locked_by="web-1:4242",
        ),
        "failed": make(reference="failed", status="failed", attempt_count=3, last_error="Boom: no"),
    }


def listed(response) -> set[str]:
    return {row.reference for row in response.context["cl"].result_list}


def test_changelist_has_the_queue_filters_columns_and_actions(admin_client, rows):
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    filters = [spec.title for spec in response.context["cl"].filter_specs]
    assert [str(t) for t in filters] == ["queue status", "retrying", "overdue"]
    html = response.content.decode()
    for name in ("run_now", "retry_failed", "cancel", "reschedule", "reprioritise"):
        assert f'value="{name}"' in html
    assert "Boom: no" in html  # the error column


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status=failed", {"failed"}),
        ("status=running", {"running"}),
        ("retrying=yes", {"retrying"}),
        ("overdue=60", {"due"}),
    ],
)
def test_filters(admin_client, rows, query, expected):
    response = admin_client.get(f"{CHANGELIST}?{query}")
    assert response.status_code == 200
    assert listed(response) == expected


def test_retry_action_confirms_then_sends_failed_rows_back(admin_client, rows, fake_clock):
    ids = [rows["failed"].pk, rows["running"].pk]
    page = admin_client.post(CHANGELIST, action_data("retry_failed", ids))
    assert page.status_code == 200
    assert "admin/django_delayq/message/action_confirmation.html" in [
        t.name for t in page.templates
    ]
    assert page.context["preview"].changed == 1
    assert Shipment.objects.get(pk=rows["failed"].pk).status == "failed"  # not yet

    done = admin_client.post(CHANGELIST, confirm_data("retry_failed", ids, extra_attempts="2"))
    assert done.status_code == 302
    failed = Shipment.objects.get(pk=rows["failed"].pk)
    assert (failed.status, failed.max_attempts) == ("pending", 5)
    assert failed.next_attempt_time == fake_clock()
    assert Shipment.objects.get(pk=rows["running"].pk).status == "running"
    assert any("Sent back to pending 1 message" in n for n in notes(done))


def test_reschedule_action_takes_a_delay(admin_client, rows, fake_clock):
    done = admin_client.post(
        CHANGELIST, confirm_data("reschedule", [rows["due"].pk], run_at="", delay="15m")
    )
    assert done.status_code == 302
    due = Shipment.objects.get(pk=rows["due"].pk)
    assert due.next_attempt_time == fake_clock() + timedelta(minutes=15)


def test_queue_columns_are_read_only_on_the_change_page(admin_client, rows):
    url = f"{CHANGELIST}{rows['failed'].pk}/change/"
    form = admin_client.get(url).context["adminform"].form
    assert "reference" in form.fields
    assert not {"status", "next_attempt_time", "attempt_count", "last_error"} & set(form.fields)
    response = admin_client.post(
        url, {"reference": "renamed", "priority": "0", "fail": "0", "sleep": "0"}
    )
    assert response.status_code == 302
    row = Shipment.objects.get(pk=rows["failed"].pk)
    assert (row.reference, row.status, row.attempt_count) == ("renamed", "failed", 3)


def test_the_mixin_refuses_a_model_without_queue_columns():
    from django.contrib import admin

    from django_delayq.admin import QueueAdminMixin
    from tests.testapp.models import Execution

    class Wrong(QueueAdminMixin, admin.ModelAdmin):
        pass

    with pytest.raises(TypeError, match="inherit QueueFields"):
        Wrong(Execution, admin.site)


def change_data(row, **changes) -> dict[str, str]:
    """What the change form posts for ``row`` (its own fields; the queue columns are
    read-only on the page)."""
    data = {
        "reference": row.reference,
        "priority": str(row.priority),
        "fail": str(row.fail),
        "sleep": str(row.sleep),
        "shipped_at_0": "",
        "shipped_at_1": "",
    }
    data.update(changes)
    return data


@pytest.mark.parametrize("meanwhile", ["claim", "ack"])
def test_saving_the_change_form_keeps_what_a_worker_wrote_meanwhile(
    admin_client, fake_clock, monkeypatch, meanwhile
):
    """The form's save wrote the whole row as the request had read it: a claim or an
    acknowledgement between that read and the save was undone (the lock token
    cleared, a finished row back to running)."""
    from django_delayq.store import claim, settle
    from tests.testapp.admin import ShipmentAdmin

    row = Shipment.objects.create(reference="a", next_attempt_time=fake_clock())
    url = f"{CHANGELIST}{row.pk}/change/"
    assert admin_client.get(url).status_code == 200
    lease = timedelta(seconds=30)
    if meanwhile == "ack":
        token = claim.claim([], 1, worker="w", lease=lease, model=Shipment).token
    original = ShipmentAdmin.save_form

    def worker_meanwhile(self, request, form, change):
        # After the request read the row and validated the form, before it saves.
        if meanwhile == "claim":
            claim.claim([], 1, worker="w", lease=lease, model=Shipment)
        else:
            settle.ack([row.pk], token, model=Shipment)
        return original(self, request, form, change)

    monkeypatch.setattr(ShipmentAdmin, "save_form", worker_meanwhile)
    before = Shipment.objects.get(pk=row.pk)

    response = admin_client.post(url, change_data(before, reference="edited"))

    assert response.status_code == 302
    after = Shipment.objects.get(pk=row.pk)
    assert after.reference == "edited"
    expected = ("running", 1, "w") if meanwhile == "claim" else ("succeeded", 1, "w")
    assert (after.status, after.attempt_count, after.locked_by) == expected
    assert (after.lock_token is not None) == (meanwhile == "claim")
