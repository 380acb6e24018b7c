"""The admin dashboard: figures, links, chart, pausing, permissions."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse

from django_delayq import stats
from django_delayq.models import Message, QueueState
from django_delayq.queues import pause_queue
from tests.admin.staff import staff_client
from tests.factories import MessageFactory

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:django_delayq_message_dashboard")
QUEUE_STATE = reverse("admin:django_delayq_message_queue_state")


@pytest.fixture
def viewer() -> Client:
    return staff_client("viewer", "view_message")[0]


@pytest.fixture
def operator() -> Client:
    return staff_client("operator", "view_message", "change_message")[0]


def make_messages(now):
    def finished(status, ago, queue="default"):
        return MessageFactory(
            queue=queue,
            status=status,
            next_attempt_time=None,
            attempt_count=1,
            finished_at=now - ago,
        )

    for _ in range(2):
        MessageFactory(next_attempt_time=now - timedelta(seconds=90))
    MessageFactory(next_attempt_time=now + timedelta(minutes=5))
    MessageFactory(next_attempt_time=now + timedelta(minutes=5), attempt_count=1)
    MessageFactory(status="running", attempt_count=1, next_attempt_time=now + timedelta(minutes=1))
    finished("failed", timedelta(minutes=2))
    finished("failed", timedelta(minutes=30))
    for _ in range(3):
        finished("succeeded", timedelta(minutes=1))
    for _ in range(2):
        finished("succeeded", timedelta(minutes=30))
    finished("succeeded", timedelta(hours=2))
    finished("cancelled", timedelta(minutes=10))
    finished("succeeded", timedelta(minutes=1), queue="other")


def test_dashboard_figures_per_queue(fake_clock):
    make_messages(fake_clock())
    fake_clock.advance(1)
    data = stats.dashboard()
    default = next(q for q in data.queues if q.queue == "default")
    assert (default.pending, default.due, default.scheduled, default.retrying) == (4, 2, 1, 1)
    assert (default.running, default.failed) == (1, 2)
    assert (default.succeeded_short, default.failed_short) == (3, 1)
    assert (default.succeeded_long, default.failed_long, default.cancelled_long) == (5, 2, 1)
    assert default.failure_rate == pytest.approx(2 / 7)
    assert default.lag == timedelta(seconds=91)
    other = next(q for q in data.queues if q.queue == "other")
    assert other.succeeded_short == 1 and other.failure_rate == 0
    assert data.totals.succeeded_short == 4
    assert data.totals.oldest_due == default.oldest_due
    # Queues with a handler but no message are listed too.
    assert {"atomic", "slow"} <= {q.queue for q in data.queues}


def test_throughput_is_per_minute_over_the_last_hour(fake_clock):
    make_messages(fake_clock())
    points = stats.throughput()
    assert len(points) == 60
    assert points == sorted(points, key=lambda p: p.minute)
    assert sum(p.succeeded for p in points) == 6  # 3 + 2 + other's 1; not the one 2 h ago
    assert sum(p.failed for p in points) == 2
    assert all(p.minute.second == 0 for p in points)


def test_every_number_links_to_the_messages_it_counts(fake_clock, viewer):
    make_messages(fake_clock())
    response = viewer.get(DASHBOARD)
    assert response.status_code == 200
    rows = {row["queue"]: row for row in response.context["rows"]}
    checked = 0
    for row in (rows["default"], rows["other"], response.context["totals"]):
        for name, cell in row["cells"].items():
            if not cell["value"]:
                continue
            listed = viewer.get(cell["url"])
            assert listed.status_code == 200, (name, cell["url"])
            assert listed.context["cl"].result_count == cell["value"], (name, cell["url"])
            checked += 1
    assert checked >= 20
    assert "?queue=default" in rows["default"]["queue_url"]


def test_dashboard_page_shows_the_chart_and_the_table(fake_clock, viewer):
    make_messages(fake_clock())
    response = viewer.get(DASHBOARD)
    html = response.content.decode()
    svg = re.search(r"<svg class=\"delayq-chart\".*?</svg>", html, re.S)
    assert svg is not None
    assert svg.group(0).count('<g class="bar">') == 60
    assert "6 succeeded, 2 failed" in svg.group(0)  # the accessible summary
    assert 'data-queue="default"' in html
    # Only the failed counts are marked bad (red), not the successes beside them.
    marked = re.findall(r'<a [^>]*class="delayq-bad" title="([^"]+)"', html)
    assert sorted(marked) == ["1 failed", "1 failed", "2 failed", "2 failed"], marked
    assert "<script" not in html.split('id="content-main"')[1]
    # No pause buttons without the change permission.
    assert 'name="action" value="pause"' not in html


# The failed messages' count: one probe of the index per queue holding some,
# one capped count each, and the probe that finds no more ("default" holds two);
# the last hour's finished messages: two ranges of the finished index.
QUERIES = 16 + 8 + 2 + 1


def test_dashboard_queries_grow_with_the_queues_holding_failed_messages_not_the_rows(
    fake_clock, viewer, django_assert_max_num_queries
):
    make_messages(fake_clock())
    # Flow control adds four: held messages, blocked groups, the live leases of
    # the capped queues, and the window of the suite's one rate ("limited");
    # the database section a fixed few reads of the server's statistics.
    with django_assert_max_num_queries(QUERIES):
        viewer.get(DASHBOARD)
    MessageFactory.create_batch(50, queue="third", status="failed", finished_at=fake_clock())
    MessageFactory.create_batch(5, queue="fourth", group="g", next_attempt_time=None)
    with django_assert_max_num_queries(QUERIES + 2):
        viewer.get(DASHBOARD)
    MessageFactory.create_batch(200, queue="third", status="failed", finished_at=fake_clock())
    with django_assert_max_num_queries(QUERIES + 2):
        viewer.get(DASHBOARD)


def test_each_queues_failed_messages_are_counted_up_to_the_cap(fake_clock, viewer, monkeypatch):
    monkeypatch.setattr(stats, "FAILED_CAP", 3)
    MessageFactory.create_batch(5, queue="many", status="failed", finished_at=fake_clock())
    MessageFactory.create_batch(3, queue="few", status="failed", finished_at=fake_clock())
    response = viewer.get(DASHBOARD)
    rows = {row["queue"]: row for row in response.context["rows"]}
    assert (rows["many"]["cells"]["failed"]["text"], rows["few"]["cells"]["failed"]["text"]) == (
        "3+",
        "3",
    )
    assert response.context["totals"]["cells"]["failed"]["text"] == "6+"
    # The link lists them all.
    listed = viewer.get(rows["many"]["cells"]["failed"]["url"])
    assert listed.context["cl"].result_count == 5


def test_app_index_and_changelist_link_to_the_dashboard(viewer):
    index = viewer.get(reverse("admin:app_list", args=["django_delayq"]))
    assert DASHBOARD in index.content.decode()
    assert reverse("admin:django_delayq_message_failures") in index.content.decode()


def test_operator_pauses_and_resumes_a_queue(operator):
    page = operator.get(DASHBOARD).content.decode()
    assert 'name="action" value="pause"' in page
    response = operator.post(
        QUEUE_STATE, {"queue": "default", "action": "pause", "reason": "provider down"}
    )
    assert response.status_code == 302 and response.url == DASHBOARD
    state = QueueState.objects.get(queue="default")
    assert state.paused and state.paused_by == "operator" and state.reason == "provider down"
    page = operator.get(DASHBOARD)
    row = next(r for r in page.context["rows"] if r["queue"] == "default")
    assert row["state"].paused
    assert "provider down" in page.content.decode()
    assert "paused" in [m.message for m in page.context["messages"]][0]

    operator.post(QUEUE_STATE, {"queue": "default", "action": "resume"})
    assert not QueueState.objects.get(queue="default").paused


def test_pausing_twice_or_a_bad_action_is_reported(operator):
    pause_queue("default")
    response = operator.post(QUEUE_STATE, {"queue": "default", "action": "pause"}, follow=True)
    assert "already paused" in response.content.decode()
    response = operator.post(QUEUE_STATE, {"queue": "default", "action": "explode"}, follow=True)
    assert "Unknown action" in response.content.decode()
    response = operator.post(QUEUE_STATE, {"queue": "", "action": "pause"}, follow=True)
    assert "queue name must not be empty" in response.content.decode().lower()


def test_a_pause_reason_with_nul_is_refused_with_a_message(operator):
    data = {"queue": "default", "action": "pause", "reason": "provider\x00down"}
    response = operator.post(QUEUE_STATE, data, follow=True)
    assert response.status_code == 200
    assert "reason contains a nul character" in response.content.decode().lower()
    assert not QueueState.objects.filter(paused=True).exists()


def test_view_permission_sees_the_dashboard_but_cannot_pause(viewer):
    assert viewer.get(DASHBOARD).status_code == 200
    response = viewer.post(QUEUE_STATE, {"queue": "default", "action": "pause"})
    assert response.status_code == 403
    assert not QueueState.objects.exists()


def test_no_permission_no_dashboard():
    client = staff_client("nobody")[0]
    assert client.get(DASHBOARD).status_code == 403
    assert client.post(QUEUE_STATE, {"queue": "default", "action": "pause"}).status_code == 403


def test_anonymous_users_are_sent_to_the_login_page():
    client = Client()
    for response in (
        client.get(DASHBOARD),
        client.post(QUEUE_STATE, {"queue": "default", "action": "pause"}),
    ):
        assert response.status_code == 302
        assert reverse("admin:login") in response.url
    assert not QueueState.objects.exists()


def test_queue_state_accepts_only_post(operator):
    assert operator.get(QUEUE_STATE).status_code == 405


def test_pausing_needs_a_csrf_token():
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff_client("csrf-operator", "view_message", "change_message")[1])
    response = client.post(QUEUE_STATE, {"queue": "default", "action": "pause"})
    assert response.status_code == 403
    assert not QueueState.objects.exists()

    client.get(DASHBOARD)  # sets the CSRF cookie, as a browser would
    token = client.cookies["csrftoken"].value
    response = client.post(
        QUEUE_STATE, {"queue": "default", "action": "pause", "csrfmiddlewaretoken": token}
    )
    assert response.status_code == 302
    assert QueueState.objects.get(queue="default").paused


def test_dashboard_without_messages(viewer):
    Message.objects.all().delete()
    response = viewer.get(DASHBOARD)
    assert response.status_code == 200
    assert response.context["totals"]["failure_rate"] == "–"
