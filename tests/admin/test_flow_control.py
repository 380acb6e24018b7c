"""Flow control in the admin: the dashboard's limits and groups, the changelist's group filters."""

from __future__ import annotations

import html as htmllib
import re
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.test import Client
from django.urls import reverse

from django_delayq import enqueue_many
from django_delayq.flow import limits_of
from django_delayq.models import Message
from django_delayq.store import claim, settle
from django_delayq.store.limits import claim_limited
from tests.admin.message_pages import CHANGELIST, change_url, listed
from tests.admin.staff import staff_client

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:django_delayq_message_dashboard")
LEASE = timedelta(minutes=5)


@pytest.fixture
def viewer() -> Client:
    return staff_client("viewer", "view_message")[0]


@pytest.fixture
def flows(settings, fake_clock) -> dict[str, list[Message]]:
    """ "default" throttled by its rate (3 started of 3 an hour, 2 due);
    "other" with group g1 blocked (its first message waits for a retry) and g2
    running its first message: three messages held behind them."""
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"default": {"RATE_LIMIT": "3/h"}}}
    enqueue_many("default", [{}] * 5)
    started = claim_limited(["default"], 10, limits_of("default"), worker="w", lease=LEASE)
    assert len(started.claim.messages) == 3
    g1 = [r.message for r in enqueue_many("other", [{}] * 3, group="g1")]
    g2 = [r.message for r in enqueue_many("other", [{}] * 2, group="g2")]
    heads = claim.claim(["other"], 10, worker="w", lease=LEASE)
    assert sorted(m.pk for m in heads.messages) == [g1[0].pk, g2[0].pk]
    settle.fail(g1[0].pk, heads.token, error="app.Boom: 42", retry_at=None, retry_in=LEASE)
    return {"g1": g1, "g2": g2}


def flow_row(response, queue: str) -> dict:
    return next(row for row in response.context["flow_rows"] if row["queue"] == queue)


def test_the_dashboard_shows_limits_how_close_and_throttled(viewer, flows):
    response = viewer.get(DASHBOARD)
    assert response.status_code == 200
    default = flow_row(response, "default")
    (scope,) = default["scopes"]
    assert (scope["limits"], scope["window"], scope["throttled"]) == ("3/h", "3/3 per h", True)
    limited = flow_row(response, "limited")  # tests/testapp/handlers.py
    assert [(s["label"], s["limits"]) for s in limited["scopes"]] == [
        ("whole queue", "2 at once"),
        ("kind webhook", "5/s"),
    ]
    assert [s["throttled"] for s in limited["scopes"]] == [False, False]
    assert limited["scopes"][0]["running"] == "0/2 running"
    page = response.content.decode()
    flow_table = page[page.index('id="delayq-flow"') :]
    row = re.search(r'<tr class="flow throttled" data-queue="default".*?</tr>', flow_table, re.S)
    assert row is not None
    assert "3/3 per h" in row.group(0) and ">throttled</a>" in row.group(0)
    assert "within limits" in flow_table
    # The queue table says so too, in the queue's state.
    queues = page[page.index('id="delayq-queues"') : page.index('id="delayq-flow"')]
    state = re.search(r'<tr class="queue" data-queue="default">.*?</tr>', queues, re.S)
    assert state is not None and "delayq-throttled" in state.group(0)
    other = re.search(r'<tr class="queue" data-queue="other">.*?</tr>', queues, re.S)
    assert other is not None and "delayq-throttled" not in other.group(0)


def test_the_dashboard_shows_held_messages_and_blocked_groups(viewer, flows):
    response = viewer.get(DASHBOARD)
    other = flow_row(response, "other")
    assert (other["flow"].held, other["flow"].blocked) == (3, 1)
    assert other["scopes"] == [{"kind": "", "label": "", "limits": ""}]
    assert [name for name, _ in other["blocked_groups"]] == ["g1"]
    page = htmllib.unescape(response.content.decode())
    assert f'href="{other["blocked_groups"][0][1]}">g1</a>' in page
    assert f'href="{other["held_url"]}">3</a>' in page


def test_every_flow_link_lists_what_it_counts(viewer, flows):
    response = viewer.get(DASHBOARD)
    other = flow_row(response, "other")
    held = viewer.get(other["held_url"])
    assert sorted(listed(held)) == sorted(m.pk for m in [*flows["g1"][1:], flows["g2"][1]])
    assert listed(viewer.get(other["blocked_url"])) == [flows["g1"][0].pk]
    (_, group_url) = other["blocked_groups"][0]
    assert sorted(listed(viewer.get(group_url))) == sorted(m.pk for m in flows["g1"])
    # The throttled scope links to the due messages that wait for it.
    (scope,) = flow_row(response, "default")["scopes"]
    due = viewer.get(scope["due_url"])
    assert due.context["cl"].result_count == 2
    assert {m.status for m in due.context["cl"].result_list} == {"pending"}


def test_the_group_filter_and_its_text_box(viewer, flows):
    response = viewer.get(f"{CHANGELIST}?{urlencode({'queue': 'other', 'group': 'g2'})}")
    assert sorted(listed(response)) == sorted(m.pk for m in flows["g2"])
    page = response.content.decode()
    box = re.search(r'<form method="get" class="dq-text-filter".*?</form>', page, re.S)
    assert box is not None
    assert '<input type="hidden" name="queue" value="other">' in box.group(0)
    assert 'name="group" value="g2"' in box.group(0)
    assert 'type="hidden" name="group"' not in box.group(0)
    # An empty box is no filter.
    assert len(listed(viewer.get(f"{CHANGELIST}?queue=other&group="))) == 5


def test_the_ordered_groups_filter(viewer, flows, settings):
    page = viewer.get(CHANGELIST).content.decode()
    assert "?group_state=blocked" in page and "?group_state=held" in page
    assert listed(viewer.get(f"{CHANGELIST}?group_state=blocked")) == [flows["g1"][0].pk]
    assert len(listed(viewer.get(f"{CHANGELIST}?group_state=held"))) == 3
    # A failed first message blocks its group, unless the queue lets groups go on.
    g2 = flows["g2"][0]
    token = Message.objects.get(pk=g2.pk).lock_token
    assert settle.fail(g2.pk, token, error="app.Boom: 7", retry_at=None) == 1
    blocked = listed(viewer.get(f"{CHANGELIST}?group_state=blocked"))
    assert sorted(blocked) == sorted([flows["g1"][0].pk, g2.pk])
    settings.DELAYQ = {
        **settings.DELAYQ,
        "QUEUES": {"other": {"GROUP_AFTER_FAILURE": "continue"}},
    }
    assert listed(viewer.get(f"{CHANGELIST}?group_state=blocked")) == [flows["g1"][0].pk]


def test_a_held_message_says_it_waits_for_its_group(admin_client, viewer, flows):
    held = flows["g1"][2]
    row_page = admin_client.get(f"{CHANGELIST}?group=g1").content.decode()
    start = row_page.index(f'value="{held.pk}" class="action-select"')
    row = row_page[start : row_page.index("</tr>", start)]
    assert "waiting for its group" in row
    # Its group links to the group's messages.
    assert 'href="?queue=other&amp;group=g1">g1</a>' in row
    page = viewer.get(change_url(held.pk)).content.decode()
    assert "waiting for its group" in page
    assert "after the earlier messages of its group" in page
    # A message that is due says when, as before.
    running = viewer.get(change_url(flows["g1"][0].pk)).content.decode()
    assert "waiting for its group" not in running


def test_search_finds_a_group_by_its_name_or_a_prefix(viewer, flows):
    assert sorted(listed(viewer.get(f"{CHANGELIST}?q=g1"))) == sorted(m.pk for m in flows["g1"])
    assert len(listed(viewer.get(f"{CHANGELIST}?q=g"))) == 5
