"""The comparison table: medians of repeated runs, hutch's ratios to the other brokers, verdicts.

Pure (no I/O) so it can be unit-tested. A `Metric` names one figure a scenario produces and,
optionally, its target against RabbitMQ (`target`) and against garagemq (`garagemq_target`):

- ``">= 2"`` / ``"<= 1"``: the ratio hutch / other broker must be at least / at most that (rates /
  latencies);
- ``"< 150"``: hutch's own value must be under 150 (an absolute bound, e.g. MiB of RSS);
- ``""``: reported only.

The table has garagemq's columns (its value, hutch / garagemq, its RSS) only when asked
(`table(rows, garagemq=True)`), so a run without it reads as before.

Runs that failed are None and are left out of the median; a figure with no runs shows "-".
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Metric:
    key: str  # the key in one run's measurements
    label: str  # what the table calls it, with its unit
    target: str = ""  # against RabbitMQ
    garagemq_target: str = ""


@dataclass(frozen=True)
class Row:
    scenario: str
    metric: Metric
    hutch: Sequence[float | None]  # one value per repeat
    rabbitmq: Sequence[float | None]
    hutch_rss: Sequence[float | None] = ()  # peak RSS in bytes, one per repeat
    rabbitmq_rss: Sequence[float | None] = ()
    garagemq: Sequence[float | None] = ()
    garagemq_rss: Sequence[float | None] = ()


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(hutch: float | None, rabbitmq: float | None) -> float | None:
    if hutch is None or not rabbitmq:
        return None
    return hutch / rabbitmq


def verdict(target: str, hutch: float | None, rabbitmq: float | None) -> str:
    """"met", "missed", or "" when there is no target or not enough figures to judge."""
    if not target:
        return ""
    op, bound = target.split()
    if op in (">=", "<="):
        value = ratio(hutch, rabbitmq)
    else:
        value = hutch
    if value is None:
        return ""
    passed = {">=": value >= float(bound), "<=": value <= float(bound), "<": value < float(bound)}[op]
    return "met" if passed else "missed"


def number(value: float | None) -> str:
    """Three significant figures at most, thousands separated: 63,512 / 12.3 / 0.842."""
    if value is None:
        return "-"
    if abs(value) >= 100:
        return "{:,.0f}".format(value)
    if abs(value) >= 10:
        return "%.1f" % value
    return "%.3g" % value


def mib(value: float | None) -> str:
    return "-" if value is None else "%.0f" % (value / 2**20)


def target_text(target: str) -> str:
    if target.startswith((">=", "<=")):
        return "ratio " + target
    return "hutch " + target if target else ""


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else "%.2f" % value


def targets(metric: Metric, h: float | None, r: float | None, g: float | None, garagemq: bool) -> tuple[str, str]:
    """The target and verdict cells: RabbitMQ's alone as before; with garagemq's columns each ratio
    target and its verdict name the broker compared with ("RabbitMQ met; garagemq missed").
    garagemq targets are ratios (an absolute bound on hutch is the RabbitMQ `target`)."""
    if not garagemq:
        return target_text(metric.target), verdict(metric.target, h, r)
    shown, judged = [], []
    for other, target, value in (("RabbitMQ", metric.target, r), ("garagemq", metric.garagemq_target, g)):
        if not target:
            continue
        name = "" if not target.startswith((">=", "<=")) else other + " "
        shown.append(name + target_text(target))
        found = verdict(target, h, value)
        if found:
            judged.append(name + found)
    return "; ".join(shown), "; ".join(judged)


def table(rows: Sequence[Row], garagemq: bool = False) -> str:
    """A Markdown table, one line per row: medians, ratios, targets and verdicts, median peak RSS."""
    if garagemq:
        lines = ["| scenario | metric | hutch | RabbitMQ | garagemq | hutch / RabbitMQ | hutch / garagemq | target "
                 "| verdict | hutch RSS MiB | RabbitMQ RSS MiB | garagemq RSS MiB |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    else:
        lines = [HEADER]
    for row in rows:
        h, r, g = median(row.hutch), median(row.rabbitmq), median(row.garagemq)
        target, judged = targets(row.metric, h, r, g, garagemq)
        cells = [row.scenario, row.metric.label, number(h), number(r)]
        if garagemq:
            cells += [number(g), _ratio_text(ratio(h, r)), _ratio_text(ratio(h, g))]
        else:
            cells.append(_ratio_text(ratio(h, r)))
        cells += [target, judged, mib(median(row.hutch_rss)), mib(median(row.rabbitmq_rss))]
        if garagemq:
            cells.append(mib(median(row.garagemq_rss)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


HEADER = ("| scenario | metric | hutch | RabbitMQ | hutch / RabbitMQ | target | verdict "
          "| hutch RSS MiB | RabbitMQ RSS MiB |\n|---|---|---|---|---|---|---|---|---|")
