"""Admin response times on a large table (PostgreSQL).

    .venv/bin/python -m benchmarks.admin_1m [--rows 1000000] [--runs 5] [--keep] [--explain]
        [--search-indexes]

Fills a scratch database (``delayq_bench_admin`` on the local PostgreSQL, or
the one ``BENCH_ADMIN_DATABASE_URL`` names: it is dropped and re-created) with
a realistic mix of messages spread over a week of retention: mostly
succeeded, some failed with a handful of error fingerprints, some cancelled,
scheduled for later, due now, retrying and running. Then it times GETs of the
admin pages through Django's test client (logged in as a superuser) and
prints the median of ``--runs`` runs per page, with the number of queries.
``--keep`` reuses the filled database of a previous run; ``--explain`` prints
``EXPLAIN ANALYZE`` of the slowest queries of each page. ``--search-indexes``
builds the indexes of ``django_delayq.contrib.search_indexes`` (its migration);
without it they are dropped (the migration reversed), so the figures say
what the search costs with and without them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.quick import reset_database

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/delayq_bench_admin"

QUEUES = ["emails", "orders", "webhooks", "reports", "sms", "billing"]

# Error templates: %1$s and %2$s receive numbers that vary per message, so each
# template is one fingerprint whatever the values.
ERRORS = [
    "app.payments.CardDeclined: card ending %1$s declined for order %2$s",
    "requests.exceptions.ConnectTimeout: HTTPSConnectionPool(host='api.example.com', "
    "port=443): Max retries exceeded with url: /v2/orders/%2$s",
    "smtplib.SMTPRecipientsRefused: {'user%2$s@example.com': (550, b'mailbox unavailable')}",
    "KeyError: 'customer_id'",
    "app.reports.ReportTooLarge: report %2$s has %1$s rows, limit is 100000",
    "ValueError: invalid literal for int() with base 10: 'N/A-%1$s'",
    "psycopg.errors.UniqueViolation: duplicate key value violates unique constraint "
    '"orders_invoice_number_key"',
    "Discarded: customer %2$s deleted",
]

FILL_SQL = """
INSERT INTO django_delayq_message (
    queue, key, kind, payload, status, priority, next_attempt_time, scheduled_time,
    attempt_count, max_attempts, last_attempt_time, last_error, last_traceback,
    error_fingerprint, lock_token, locked_by, created_at, updated_at, finished_at
)
SELECT
    queue,
    'k-' || g,
    CASE WHEN g %% 3 = 0 THEN queue || '.v2' ELSE '' END,
    jsonb_build_object(
        'companyId', g %% 5000, 'orderId', g, 'email', 'user' || g || '@example.com',
        'amount', (g %% 997) * 1.5, 'tags', jsonb_build_array('t' || (g %% 7), 'bulk')
    ),
    status,
    CASE WHEN g %% 50 = 0 THEN 5 ELSE 0 END,
    CASE status
        WHEN 'pending' THEN CASE WHEN due THEN now() - r3 * interval '10 minutes'
                                 ELSE now() + r3 * interval '3 days' END
        WHEN 'running' THEN now() + interval '60 seconds'
    END,
    created,
    attempts,
    NULL,
    CASE WHEN attempts > 0 THEN coalesce(finished, now() - r3 * interval '1 hour') END,
    CASE WHEN errored
         THEN format((%(errors)s::text[])[error_no], (g::bigint * 7919) %% 10000, g) ELSE '' END,
    CASE WHEN errored THEN 'Traceback (most recent call last):\n  ...' ELSE '' END,
    CASE WHEN errored THEN (%(fingerprints)s::text[])[error_no] ELSE '' END,
    CASE WHEN status = 'running' THEN gen_random_uuid() END,
    CASE WHEN status = 'running' THEN 'bench:1' ELSE '' END,
    created,
    coalesce(finished, created),
    finished
FROM (
    SELECT *,
        status IN ('failed') OR (status = 'pending' AND attempts > 0) AS errored,
        CASE WHEN status IN ('succeeded', 'failed', 'cancelled')
             THEN now() - r3 * interval '7 days' END AS finished,
        CASE WHEN status IN ('succeeded', 'failed', 'cancelled')
             THEN now() - r3 * interval '7 days' - interval '3 seconds'
             ELSE now() - r3 * interval '1 day' END AS created
    FROM (
        SELECT *,
            CASE status
                WHEN 'succeeded' THEN 1 + (r2 < 0.05)::int
                WHEN 'failed' THEN 5
                WHEN 'running' THEN 1
                WHEN 'pending' THEN CASE WHEN r2 < 0.25 THEN 1 + (g %% 4) ELSE 0 END
                ELSE 0
            END AS attempts
        FROM (
            SELECT g, r2, r3, due,
                (%(queues)s::text[])[1 + floor(r2 * r2 * 6)::int] AS queue,
                -- A few fingerprints dominate, as in real incidents.
                1 + floor(r3 * r3 * 8)::int AS error_no,
                CASE
                    WHEN r < (%(cuts)s::float8[])[1] THEN 'succeeded'
                    WHEN r < (%(cuts)s::float8[])[2] THEN 'failed'
                    WHEN r < (%(cuts)s::float8[])[3] THEN 'cancelled'
                    WHEN r < (%(cuts)s::float8[])[4] THEN 'pending'
                    ELSE 'running'
                END AS status
            FROM (
                SELECT g, random() AS r, random() AS r2, random() AS r3,
                       random() < 0.35 AS due
                FROM generate_series(1, %(rows)s) AS g
            ) AS raw
        ) AS picked
    ) AS counted
) AS timed
-- A queue's table holds its rows in about the order they were created: the
-- messages that finished in the last hour sit together at its end, not one
-- on each page of the table.
ORDER BY created
"""


# The share of each status: up to the first cut succeeded, then failed,
# cancelled, pending, the rest running. LIVE: a busy installation's mix;
# FINISHED: only what retention keeps (benchmarks/history.py).
LIVE = (0.900, 0.940, 0.950, 0.995)
FINISHED = (0.947, 0.990, 1.0, 1.0)


def fill(rows: int, cuts: tuple[float, ...] = LIVE) -> None:
    from django.db import connection

    from django_delayq.fingerprint import fingerprint

    samples = [template.replace("%1$s", "1234").replace("%2$s", "5678") for template in ERRORS]
    params = {
        "rows": rows,
        "cuts": list(cuts),
        "queues": QUEUES,
        "errors": ERRORS,
        "fingerprints": [fingerprint(sample) for sample in samples],
    }
    start = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.42)")
        cursor.execute(FILL_SQL, params)
    print(f"filled {rows:,} rows in {time.perf_counter() - start:.1f} s", flush=True)
    start = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE django_delayq_message")
    print(f"VACUUM ANALYZE in {time.perf_counter() - start:.1f} s", flush=True)


def pages() -> list[tuple[str, str]]:
    from django.urls import NoReverseMatch, reverse

    changelist = reverse("admin:django_delayq_message_changelist")
    found = [
        ("changelist", changelist),
        ("changelist status=failed", changelist + "?status__exact=failed"),
        ("payload search companyId=3345", changelist + "?q=companyId%3D3345"),
        ("key search k-424242", changelist + "?q=k-424242"),
    ]
    for label, name in [
        ("dashboard", "admin:django_delayq_message_dashboard"),
        ("failures", "admin:django_delayq_message_failures"),
    ]:
        try:
            found.append((label, reverse(name)))
        except NoReverseMatch:
            print(f"({label}: no such admin URL yet, skipped)")
    return found


def explain(queries: list[dict[str, str]], top: int = 3) -> None:
    from django.db import connection

    slowest = sorted(queries, key=lambda q: float(q["time"]), reverse=True)[:top]
    for query in slowest:
        if not query["sql"].lstrip().upper().startswith("SELECT"):
            continue
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + query["sql"])
            plan = "\n".join(row[0] for row in cursor.fetchall())
        print(f"\n-- {float(query['time']) * 1000:.1f} ms: {query['sql'][:300]}\n{plan}")


def measure(runs: int, show_plans: bool) -> list[tuple[str, float, float, int]]:
    """Times each admin page; returns (page, median ms, max ms, queries) per page."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user_model = get_user_model()
    user = user_model.objects.filter(username="bench").first() or (
        user_model.objects.create_superuser("bench", "bench@example.com", "bench")
    )
    client = Client()
    client.force_login(user)
    results = []
    for label, url in pages():
        response = client.get(url)  # warm caches and the connection
        assert response.status_code == 200, (label, url, response.status_code)
        timings = []
        for _ in range(runs):
            with CaptureQueriesContext(connection) as captured:
                start = time.perf_counter()
                response = client.get(url)
                timings.append((time.perf_counter() - start) * 1000)
            assert response.status_code == 200, (label, response.status_code)
        results.append((label, statistics.median(timings), max(timings), len(captured)))
        if show_plans:
            print(f"\n==== {label}: {url}")
            explain(captured.captured_queries)
    print(f"\n{'page':<32} {'median ms':>10} {'max ms':>8} {'queries':>8}")
    for label, median, worst, count in results:
        print(f"{label:<32} {median:>10.1f} {worst:>8.1f} {count:>8}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="reuse the filled database")
    parser.add_argument("--explain", action="store_true", help="print plans of slow queries")
    parser.add_argument(
        "--search-indexes", action="store_true", help="with the opt-in search indexes"
    )
    args = parser.parse_args()
    url = os.environ.get("BENCH_ADMIN_DATABASE_URL", DEFAULT_URL)
    if not url.startswith("postgres"):
        sys.exit("this benchmark needs PostgreSQL (BENCH_ADMIN_DATABASE_URL=postgres://...)")
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["BENCH_ADMIN"] = "1"  # the admin and the apps it needs
    if not args.keep:
        reset_database(url)
    os.environ["BENCH_SEARCH_INDEXES"] = "1"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    migrate = [sys.executable, "-m", "django", "migrate", "-v0"]
    subprocess.run(migrate, check=True, env=env, cwd=ROOT)
    if not args.search_indexes:
        subprocess.run([*migrate, "delayq_search_indexes", "zero"], check=True, env=env, cwd=ROOT)

    import django

    django.setup()
    from django_delayq.models import Message

    print(f"database: {url.split('@')[-1]}, search indexes: {bool(args.search_indexes)}")
    if not args.keep or not Message.objects.exists():
        fill(args.rows)
    measure(args.runs, args.explain)


if __name__ == "__main__":
    main()
