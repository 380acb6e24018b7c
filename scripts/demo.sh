#!/usr/bin/env bash
# Run the example project end to end on its SQLite default:
#
#   scripts/demo.sh [PYTHON]      (PYTHON: the virtualenv's python, default .venv/bin/python)
#
# A fresh database, migrations, demo orders and emails (seed_demo), then a
# worker (run_delayq --concurrency 2) in the background until every message
# has succeeded or failed (the heartbeat schedule's future ticks aside), a
# SIGTERM for a graceful shutdown, and a summary:
# delayed messages started no earlier than their due time, the atomic order
# handler confirmed every order, the email to broken@fail.example was
# retried and then marked failed, and the shipments (rows of a QueueFields
# model, booked by their own handler) were booked except the undeliverable
# one, which was retried and then marked failed; each order's events (its
# ordered group) ran one after the other, in order, and its order.shipped
# marked it shipped; no more emails started in any second than the emails
# queue's RATE_LIMIT. Exits non-zero if any of that failed, if the worker
# did not stop cleanly or the queue did not drain in time.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${1:-.venv/bin/python}"
# We cd into example_project/ below: make a relative interpreter path absolute
# (without resolving symlinks, which would step out of the virtualenv).
if [[ "$PY" == */* && "$PY" != /* ]]; then
  PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
fi
DEADLINE_SECONDS="${DEMO_DEADLINE:-60}"

# The demo always uses the example project's SQLite file, which it recreates,
# even if DATABASE_URL points somewhere else in this shell.
unset DATABASE_URL
export PYTHONUNBUFFERED=1

cd example_project

step() { printf '\n=== %s\n' "$*"; }
manage() { "$PY" manage.py "$@"; }
# Run a Python snippet with Django set up (no automatic imports, no banner).
django_py() { "$PY" manage.py shell --no-imports -v 0 -c "$1"; }

worker_pid=""
cleanup() {
  if [[ -n "$worker_pid" ]] && kill -0 "$worker_pid" 2>/dev/null; then
    kill -TERM "$worker_pid" 2>/dev/null || true
    wait "$worker_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

step "fresh database: migrate"
rm -f db.sqlite3 db.sqlite3-wal db.sqlite3-shm
manage migrate --no-input -v 0
echo "migrated $(pwd)/db.sqlite3"

step "seed_demo: produce orders and messages"
manage seed_demo

step "delayq_status before the worker starts"
manage delayq_status

step "run_delayq --concurrency 2 (in the background; its log follows)"
# Started directly (not through a shell function, which would fork a subshell)
# so that $! is the worker itself and our SIGTERM reaches it; its log goes to
# stdout so that it interleaves with this script's output.
"$PY" manage.py run_delayq --concurrency 2 2>&1 &
worker_pid=$!

# Drained: no message pending or running, except the heartbeat schedule's
# future ticks (a recurring schedule always has some installed ahead).
ACTIVE_PY='
import sys
from django.db.models import Q
from django_delayq import clock
from django_delayq.models import Message
from orders.models import Shipment
waiting = Message.objects.active().exclude(
    Q(key__startswith="cron:") & Q(status="pending", next_attempt_time__gt=clock.now())
)
sys.exit(1 if waiting.exists() or Shipment.objects.active().exists() else 0)
'
started=$SECONDS
drained=0
while (( SECONDS - started < DEADLINE_SECONDS )); do
  sleep 1
  if ! kill -0 "$worker_pid" 2>/dev/null; then
    echo "demo: the worker exited on its own" >&2
    break
  fi
  if django_py "$ACTIVE_PY"; then
    drained=1
    break
  fi
done
if (( drained )); then
  echo "demo: no message pending or running after $(( SECONDS - started )) s; stopping the worker"
else
  echo "demo: messages still pending or running; stopping the worker" >&2
fi

worker_rc=0
if kill -0 "$worker_pid" 2>/dev/null; then
  kill -TERM "$worker_pid"
fi
wait "$worker_pid" || worker_rc=$?
worker_pid=""
echo "demo: worker exited with status $worker_rc"

step "delayq_status after the run"
manage delayq_status

step "what happened"
SUMMARY_PY='
import sys
from django.conf import settings
from django_delayq.backends import TASK_KIND
from django_delayq.flow import parse_rate
from django.db.models import Min
from django_delayq.models import FlowStart, Message, WorkerState
from orders.models import Order, Shipment
from orders.tasks import send_receipt

def secs(start, end):
    return f"+{(end - start).total_seconds():.1f}s" if start and end else "-"

rows = [("queue", "key", "status", "tries", "due", "started", "done", "last error")]
early = []
# Future ticks of the heartbeat schedule are expected to wait: leave them out.
future_ticks = Message.objects.filter(
    key__startswith="cron:", status="pending", attempt_count=0
)
shown = Message.objects.exclude(pk__in=future_ticks.values("pk"))
for m in shown.order_by("scheduled_time", "id"):
    rows.append((
        m.queue, m.key, m.status, str(m.attempt_count),
        secs(m.created_at, m.scheduled_time),
        secs(m.created_at, m.last_attempt_time),
        secs(m.created_at, m.finished_at),
        m.error_summary(),
    ))
    if m.attempt_count and m.last_attempt_time < m.scheduled_time:
        early.append(m.key)
widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
print("Messages (times relative to enqueue; started = last attempt):")
for r in rows:
    print(("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]).rstrip())

print()
print("Orders (confirmed by order.placed, then shipped by order.shipped once a shipment is booked):")
for o in Order.objects.all():
    print(f"  #{o.pk:<3} {o.customer_email:<22} {o.total:>7}  {o.status}")
booked = set(Shipment.objects.filter(status="succeeded").values_list("order_id", flat=True))
wrong_orders = [
    o.pk
    for o in Order.objects.all()
    if o.status != (Order.Status.SHIPPED if o.pk in booked else Order.Status.CONFIRMED)
]

print()
print("Ordered groups (queue orders, group order-<id>): the events of each order, one at a time,")
print("in order (times relative to the first message of the group; waited: from enqueue to start):")
groups = {}
for m in Message.objects.filter(queue="orders").exclude(group="").order_by("id"):
    groups.setdefault(m.group, []).append(m)
disorder = []
for name, events in groups.items():
    first = events[0].created_at
    shown_events = []
    for before, m in zip([None, *events], events):
        text = (
            f"{m.kind} {m.status} (tries {m.attempt_count}, enqueued {secs(first, m.created_at)}, "
            f"ran {secs(first, m.last_attempt_time)}..{secs(first, m.finished_at)}"
        )
        if m.last_attempt_time and m.created_at:
            text += f", waited {(m.last_attempt_time - m.created_at).total_seconds():.1f}s"
        if before is not None and before.finished_at and m.created_at < before.finished_at:
            text += ": held until the one before was done"
        shown_events.append(text + ")")
        if before is not None and (
            not before.finished_at
            or not m.last_attempt_time
            or m.last_attempt_time < before.finished_at
        ):
            disorder.append(m.key)
    print(f"  {name:<9} " + "\n            then ".join(shown_events))

print()
setting = settings.DELAYQ["QUEUES"]["emails"]["RATE_LIMIT"]
rate = parse_rate(setting)
starts = sorted(
    FlowStart.objects.filter(flow__queue="emails", flow__kind="").values_list("started_at", flat=True)
)
most = low = 0
for high, t in enumerate(starts):
    while starts[low] <= t - rate.period:
        low += 1
    most = max(most, high - low + 1)
# How long each email (its first and only attempt) waited once it was due and
# the worker was up: the limit is what keeps an idle worker from starting it.
worker_start = WorkerState.objects.aggregate(t=Min("started_at"))["t"]
waits = [
    (m.last_attempt_time - max(m.scheduled_time, worker_start)).total_seconds()
    for m in Message.objects.filter(queue="emails", attempt_count=1)
]
held = [w for w in waits if w > 0.25]
print(
    f"Rate limit of the emails queue (RATE_LIMIT {setting!r}, for every worker together): "
    f"{len(starts)} starts, at most {most} in any {rate.period.total_seconds():g} s window;"
)
print(
    f"  {len(held)} of {len(waits)} emails that ran once were held back by it: started more than "
    f"0.25 s after they were due (or the worker started), up to {max(held, default=0):.1f} s."
)

print()
ran = Message.objects.filter(key__startswith="cron:heartbeat:", status="succeeded").count()
upcoming = future_ticks.order_by("next_attempt_time").first()
print(
    f"Schedule heartbeat (every 3 s): {ran} tick(s) ran; "
    f"{future_ticks.count()} installed ahead"
    + (f", next at {upcoming.next_attempt_time:%H:%M:%S}" if upcoming else "")
)

print()
print("Django task (orders/tasks.py through DelayQBackend, read back with get_result):")
unfinished_tasks = []
for m in Message.objects.filter(kind=TASK_KIND).order_by("pk"):
    r = send_receipt.get_result(str(m.pk))
    outcome = r.return_value if r.status == "SUCCESSFUL" else r.errors
    print(f"  {r.task.name} #{r.id}: {r.status}, attempts {r.attempts} -> {outcome}")
    if r.status != "SUCCESSFUL":
        unfinished_tasks.append(r.id)

print()
print("Shipments (rows of a QueueFields model, booked by their own handler):")
for s in Shipment.objects.all():
    print(
        f"  #{s.pk:<3} order #{s.order_id:<3} {s.address:<16} {s.status:<9} "
        f"tries {s.attempt_count}  {s.tracking_number or s.error_summary()}"
    )
undeliverable = Shipment.objects.filter(address__startswith="Nowhere")
bad_shipments = Shipment.objects.exclude(pk__in=undeliverable.values("pk")).exclude(
    status="succeeded", tracking_number__startswith="TRK-"
)
bad_shipments = list(bad_shipments.values_list("pk", flat=True))
bad_shipments += list(undeliverable.exclude(status="failed").values_list("pk", flat=True))

counts = {s: shown.filter(status=s).count() for s in Message.Status.values}
shipments = {s: Shipment.objects.filter(status=s).count() for s in Message.Status.values}
attempts = sum(m.attempt_count for m in shown) + sum(s.attempt_count for s in Shipment.objects.all())
print()
print(
    "Totals, messages (future heartbeat ticks aside): "
    + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
)
print("Totals, shipments: " + ", ".join(f"{n} {s}" for s, n in shipments.items() if n))
print(
    f"Attempts: {attempts}, messages and shipments together (the \"stopped\" line of the "
    "worker above counts these by outcome; a retried message counts once per try)"
)
problems = []
if early:
    problems.append(f"started before their due time: {early}")
if wrong_orders:
    problems.append(f"orders not confirmed, or not shipped once booked: {wrong_orders}")
if disorder:
    problems.append(f"group messages that started before the one before them was done: {disorder}")
if most > rate.count:
    problems.append(f"the emails queue started {most} in one window (RATE_LIMIT {setting!r})")
if unfinished_tasks:
    problems.append(f"tasks that did not succeed: {unfinished_tasks}")
if bad_shipments:
    problems.append(f"shipments that did not end as expected: {bad_shipments}")
if counts["pending"] or counts["running"]:
    problems.append("some messages are still pending or running")
for p in problems:
    print("PROBLEM: " + p)
if not problems:
    print(
        "Every message started at or after its due time; every order is confirmed (and shipped "
        "once booked), its events in order; the emails kept to their rate."
    )
sys.exit(1 if problems else 0)
'
summary_rc=0
django_py "$SUMMARY_PY" || summary_rc=$?

if (( worker_rc != 0 )); then
  echo "demo: FAILED: the worker exited with status $worker_rc" >&2
  exit "$worker_rc"
fi
if (( ! drained || summary_rc != 0 )); then
  echo "demo: FAILED" >&2
  exit 1
fi
echo
echo "demo: OK. Browse it with: cd example_project && $PY manage.py createsuperuser && $PY manage.py runserver  (then /admin/)"
