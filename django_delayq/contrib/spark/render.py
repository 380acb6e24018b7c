"""The report for people: a terminal table, ``report.html``, ``report.json`` and PNG charts.

Plain Python over the figures ``report_job`` computed; matplotlib through its
object API (no pyplot, so no global backend is switched in the caller's
process).
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
from datetime import date
from typing import Any

from django_delayq import durations
from django_delayq.contrib.spark import PipelineError
from django_delayq.contrib.spark.report_job import ATTEMPT_BUCKETS, Figures, Report
from django_delayq.contrib.spark.storage import replace_local_file

HEADER = (
    "queue",
    "day",
    "messages",
    "ok",
    "failed",
    "cancelled",
    "attempts",
    "lag p50",
    "p95",
    "p99",
    "processing p50",
    "p95",
    "p99",
)


def duration(seconds: float | None) -> str:
    return "-" if seconds is None else durations.human(seconds, durations.REPORT)


def _percent(value: float) -> str:
    return f"{value * 100:.1f}%"


def _cells(f: Figures) -> list[str]:
    lag = f.lag or (None, None, None)
    processing = f.processing or (None, None, None)
    return [
        f.queue,
        f.day.isoformat() if f.day else "all",
        f"{f.messages:,}",
        _percent(f.rate("succeeded")),
        _percent(f.rate("failed")),
        _percent(f.rate("cancelled")),
        f"{f.attempts_mean:.2f} (max {f.attempts_max})",
        *(duration(v) for v in lag),
        *(duration(v) for v in processing),
    ]


def table(report: Report) -> str:
    """The figures per queue and day, then per queue, then the top errors."""
    rows = [list(HEADER)]
    for queue in report.queues:
        rows += [_cells(f) for f in report.days if f.queue == queue.queue]
        rows.append(_cells(queue))
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = []
    for n, r in enumerate(rows):
        lines.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    if report.errors:
        lines += ["", "top errors (messages, of which failed)"]
        for e in report.errors:
            lines.append(
                f"{e.queue}  {e.count:>7,} {e.failed:>7,}  {e.error}  [{e.fingerprint[:8]}]"
            )
    return "\n".join(lines)


def _json_ready(value: Any) -> Any:
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    return value


def as_dict(report: Report) -> dict[str, Any]:
    return dict(_json_ready(dataclasses.asdict(report)))


def write_report(report: Report, out: str) -> list[str]:
    """Write ``report.json``, ``lag.png``, ``throughput.png`` and ``report.html``; their paths.

    Each file is written whole and private (mode 0600), never through a link
    planted at its name (``storage.replace_local_file``); ``out`` is created
    mode 0700 if it does not exist.
    """
    os.makedirs(out, mode=0o700, exist_ok=True)
    files = [os.path.join(out, name) for name in ("report.html", "report.json")]
    charts = [os.path.join(out, "lag.png"), os.path.join(out, "throughput.png")]
    try:
        text = json.dumps(as_dict(report), indent=1).encode()
        replace_local_file(files[1], lambda handle: handle.write(text))
        lag_chart(report, charts[0])
        throughput_chart(report, charts[1])
        page = to_html(report).encode()
        replace_local_file(files[0], lambda handle: handle.write(page))
    except OSError as exc:
        raise PipelineError(f"cannot write the report in {out}: {exc}") from exc
    return files + charts


def to_html(report: Report) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in HEADER)
    body = []
    for queue in report.queues:
        for f in [d for d in report.days if d.queue == queue.queue] + [queue]:
            cls = ' class="total"' if f.day is None else ""
            body.append(f"<tr{cls}>" + "".join(f"<td>{esc(c)}</td>" for c in _cells(f)) + "</tr>")
    attempts_head = "".join(f"<th>{b}</th>" for b in ATTEMPT_BUCKETS)
    attempts = [
        f"<tr><td>{esc(q.queue)}</td>"
        + "".join(f"<td>{q.attempts[b]:,}</td>" for b in ATTEMPT_BUCKETS)
        + "</tr>"
        for q in report.queues
    ]
    errors = [
        f"<tr><td>{esc(e.queue)}</td><td>{e.count:,}</td><td>{e.failed:,}</td>"
        f'<td class="text"><code>{esc(e.error)}</code></td>'
        f"<td>{e.first_day} – {e.last_day}</td>"
        f"<td><code>{esc(e.fingerprint)}</code></td></tr>"
        for e in report.errors
    ]
    since = f" since {report.since}" if report.since else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>django-delayq delivery report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
td:first-child, th:first-child, td:nth-child(2) {{ text-align: left; }}
td.text {{ text-align: left; }}
tr.total {{ font-weight: bold; background: #f4f4f4; }}
code {{ font-size: 0.95em; }}
</style></head><body>
<h1>Delivery report</h1>
<p>{report.rows:,} message(s) from <code>{esc(report.source)}</code>{esc(since)}.
Days are UTC finish dates. Lag: first start minus originally scheduled time, measured on
messages that ran once. Processing: finish minus start of the last attempt. Percentiles
are nearest-rank.</p>
<h2>Per queue and day</h2>
<table><tr>{head}</tr>{"".join(body)}</table>
<p><img src="lag.png" alt="delivery lag percentiles per day">
<img src="throughput.png" alt="messages finished per day"></p>
<h2>Attempts</h2>
<table><tr><th>queue</th>{attempts_head}</tr>{"".join(attempts)}</table>
<h2>Top errors</h2>
<table><tr><th>queue</th><th>messages</th><th>failed</th><th>error</th><th>seen</th>
<th>fingerprint</th></tr>{"".join(errors) or '<tr><td colspan="6">none</td></tr>'}</table>
</body></html>
"""


def _figure(width: float = 9, height: float = 4.5) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _days(report: Report) -> list[date]:
    return sorted({f.day for f in report.days if f.day is not None})


def lag_chart(report: Report, path: str) -> None:
    """Delivery lag p50 / p95 / p99 per day, one colour per queue."""
    fig = _figure()
    ax = fig.subplots()
    days = _days(report)
    index = {d: i for i, d in enumerate(days)}
    styles = (("p50", "-", "o", 0), ("p95", "--", "s", 1), ("p99", ":", "^", 2))
    for n, queue in enumerate(report.queues):
        points = [f for f in report.days if f.queue == queue.queue and f.lag is not None]
        if not points:
            continue
        colour = f"C{n % 10}"
        for label, style, marker, i in styles:
            ax.plot(
                [index[f.day] for f in points if f.day],
                [f.lag[i] for f in points if f.lag],
                linestyle=style,
                marker=marker,
                color=colour,
                label=f"{queue.queue} {label}",
            )
    ax.set_title("Delivery lag (first start − scheduled), per finish day")
    ax.set_ylabel("seconds")
    highest = max((f.lag[2] for f in report.days if f.lag), default=0.0)
    ax.set_ylim(0, highest * 1.15 or 1.0)
    _day_axis(ax, days)
    if ax.lines:
        ax.legend(fontsize="small", ncol=3)
    replace_local_file(path, lambda handle: fig.savefig(handle, format="png"))


def throughput_chart(report: Report, path: str) -> None:
    """Messages finished per day, stacked by queue."""
    fig = _figure()
    ax = fig.subplots()
    days = _days(report)
    bottom = [0] * len(days)
    for n, queue in enumerate(report.queues):
        counts = {f.day: f.messages for f in report.days if f.queue == queue.queue}
        heights = [counts.get(d, 0) for d in days]
        ax.bar(range(len(days)), heights, bottom=bottom, color=f"C{n % 10}", label=queue.queue)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_title("Messages finished per day")
    ax.set_ylabel("messages")
    _day_axis(ax, days)
    if report.queues:
        ax.legend(fontsize="small")
    replace_local_file(path, lambda handle: fig.savefig(handle, format="png"))


def _day_axis(ax: Any, days: list[date]) -> None:
    ax.set_xticks(range(len(days)))
    ax.set_xticklabels([d.isoformat() for d in days], rotation=45, ha="right", fontsize="small")
    ax.grid(axis="y", alpha=0.3)
