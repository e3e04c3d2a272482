"""The HTML report: every analysis of jobs.py on one self-contained page
(inline CSS and SVG charts, nothing fetched). `gather` runs the Spark jobs
and collects their (small) results; `render` is a pure function of them."""
from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from html import escape

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_sink import charts, jobs


@dataclass
class ReportData:
    title: str
    source: str  # where the dead letters came from (broker URL and vhost)
    total: int
    first_offset: int | None
    last_offset: int | None
    first_time: datetime.datetime | None
    last_time: datetime.datetime | None
    window: str
    reasons: list[tuple[str, int, float]] = field(default_factory=list)
    timeline: list[tuple[datetime.datetime, str, int]] = field(default_factory=list)  # window start, reason, count
    queues: list[dict] = field(default_factory=list)  # breakdown rows
    top_queues: list[dict] = field(default_factory=list)
    delivery_counts: list[dict] = field(default_factory=list)
    death_histogram: list[tuple[int, int]] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)


def gather(df: DataFrame, options: jobs.JobOptions, title: str, source: str) -> ReportData:
    """Run every analysis on `df` (cache it first when it is read more than once)."""
    summary = df.agg(F.count("*").alias("n"), F.min("offset").alias("o0"), F.max("offset").alias("o1"),
                     F.min("time").alias("t0"), F.max("time").alias("t1")).first()
    data = ReportData(title, source, summary.n, summary.o0, summary.o1, summary.t0, summary.t1, options.window)
    data.reasons = [(r.reason, r["count"], r.percent) for r in jobs.reasons(df).collect()]
    data.timeline = [(r.window_start, r.reason, r["count"])
                     for r in jobs.by_dimension(df, "reason", options.window).collect()]
    data.queues = [r.asDict() for r in jobs.breakdown(df).limit(options.top).collect()]
    data.top_queues = [r.asDict() for r in jobs.top_queues(df, options.top).collect()]
    data.delivery_counts = [r.asDict() for r in jobs.delivery_counts(df).collect()]
    data.death_histogram = [(r.death_count, r["count"]) for r in jobs.death_histogram(df).collect()]
    data.samples = [r.asDict() for r in jobs.samples(df, options.samples).collect()]
    return data


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;background:#f6f7f9;color:#222}
header{background:#2b3340;color:#fff;padding:22px 32px}
header h1{margin:0 0 4px;font-size:22px;font-weight:600}
header p{margin:0;color:#c9d1dc;font-size:13px}
main{padding:20px 32px;max-width:1100px}
.cards{display:flex;gap:14px;flex-wrap:wrap;margin-bottom:18px}
.card{background:#fff;border-radius:8px;padding:14px 18px;min-width:140px;box-shadow:0 1px 3px #0001}
.card b{display:block;font-size:26px}
.card span{color:#666;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
section{background:#fff;border-radius:8px;padding:16px 20px;margin-bottom:18px;box-shadow:0 1px 3px #0001}
h2{font-size:16px;margin:0 0 12px}
table{border-collapse:collapse;font-size:13px;width:100%}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #eee}
th{color:#555;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:12px;color:#444}
.empty{color:#777}
"""


def render(data: ReportData) -> str:
    reasons = [name for name, count, _p in data.reasons if count] or [name for name, _c, _p in data.reasons]
    cards = [("dead letters", "%d" % data.total)]
    cards += [(name, "%d" % count) for name, count, _p in data.reasons]
    if data.first_offset is not None:
        cards.append(("offsets", "%d\u2013%d" % (data.first_offset, data.last_offset)))
    sections = [
        _section("Why messages died", charts.horizontal_bars([(n, c) for n, c, _p in data.reasons], "reasons")
                 + _table(["reason", "count", "%"], [[n, c, p] for n, c, p in data.reasons])),
        _section("Dead letters over time (per %s)" % escape(data.window), _timeline(data, reasons)),
        _section("Failing queues: expiry vs rejection vs length limit", _queues(data, reasons)),
        _section("Top failing queues", _table(
            ["vhost", "queue", "dead letters", "main reason", "first", "last", "bytes"],
            [[q["vhost"], q["queue"], q["count"], q["main_reason"], _time(q["first"]), _time(q["last"]), q["bytes"]]
             for q in data.top_queues])),
        _section("Deaths and deliveries per message", charts.horizontal_bars(
            [("died %d\u00d7" % deaths, count) for deaths, count in data.death_histogram], "death counts")
            + _table(["reason", "count", "min deaths", "avg deaths", "max deaths", "p95 deaths",
                      "avg delivery count", "max delivery count"],
                     [[d["reason"], d["count"], d["min_deaths"], d["avg_deaths"], d["max_deaths"], d["p95_deaths"],
                       d["avg_delivery_count"], d["max_delivery_count"]] for d in data.delivery_counts])),
        _section("Sample messages per reason", _table(
            ["reason", "offset", "time", "queue", "exchange", "routing keys", "message id", "deaths", "size",
             "body"],
            [[s["reason"], s["offset"], _time(s["time"]), s["queue"], s["exchange"], s["routing_keys"],
              s["message_id"] or "", s["death_count"], s["body_size"], _code(s["body_preview"])]
             for s in data.samples])),
    ]
    span = ""
    if data.first_time is not None:
        span = " \u00b7 %s to %s" % (_time(data.first_time), _time(data.last_time))
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>%s</title><style>%s</style></head>"
        % (escape(data.title), _CSS),
        "<body><header><h1>%s</h1><p>%s%s</p></header><main>" % (escape(data.title), escape(data.source), span),
        "<div class=\"cards\">%s</div>" % "".join(
            "<div class=\"card\"><b>%s</b><span>%s</span></div>" % (escape(v), escape(k)) for k, v in cards),
        "".join(sections),
        "</main></body></html>\n",
    ])


def _timeline(data: ReportData, reasons: list[str]) -> str:
    if not data.timeline:
        return '<p class="empty">No dead letters.</p>'
    starts = sorted({start for start, _r, _c in data.timeline})
    column = {start: i for i, start in enumerate(starts)}
    series = {name: [0] * len(starts) for name in reasons}
    for start, reason, count in data.timeline:
        series.setdefault(reason, [0] * len(starts))[column[start]] += count
    if len({s.date() for s in starts}) == 1:  # one day: the date is in the header, label the time
        fmt = "%H:%M:%S" if any(s.second for s in starts) else "%H:%M"
    else:
        fmt = "%m-%d %H:%M"
    return charts.stacked_columns([s.strftime(fmt) for s in starts], series, "dead letters over time")


def _queues(data: ReportData, reasons: list[str]) -> str:
    if not data.queues:
        return '<p class="empty">No dead letters.</p>'
    labels = ["%s %s" % (q["vhost"], q["queue"]) if q["vhost"] != "/" else q["queue"] for q in data.queues]
    series = {name: [q.get(name, 0) for q in data.queues] for name in reasons}
    rows = [[q["vhost"], q["queue"]] + [q[name] for name in jobs.REASONS] + [q["total"], q["share"]]
            for q in data.queues]
    return (charts.stacked_bars(labels, series, "dead letters per queue by reason")
            + _table(["vhost", "queue", *jobs.REASONS, "total", "% of all"], rows))


def _section(title: str, body: str) -> str:
    return "<section><h2>%s</h2>%s</section>" % (escape(title), body)


class _Raw(str):
    """Cell text that is already HTML."""


def _code(text: str | None) -> _Raw:
    return _Raw("<code>%s</code>" % escape(text or ""))


def _table(columns: list[str], rows: list[list]) -> str:
    if not rows:
        return '<p class="empty">No dead letters.</p>'
    head = "".join("<th>%s</th>" % escape(c) for c in columns)
    body = []
    for row in rows:
        cells = []
        for value in row:
            if isinstance(value, _Raw):
                cells.append("<td>%s</td>" % value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                cells.append('<td class="n">%s</td>' % escape(charts.number(value)))
            else:
                cells.append("<td>%s</td>" % escape("" if value is None else str(value)))
        body.append("<tr>%s</tr>" % "".join(cells))
    return "<table><tr>%s</tr>%s</table>" % (head, "".join(body))


def _time(value: datetime.datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")
