"""The comparison table: medians of repeated runs, the hutch / RabbitMQ ratio, the target verdict.

Pure (no I/O) so it can be unit-tested. A `Metric` names one figure a scenario produces and,
optionally, its target:

- ``">= 1"`` / ``"<= 1"``: the ratio hutch / RabbitMQ must be at least / at most 1 (rates /
  latencies);
- ``"< 150"``: hutch's own value must be under 150 (an absolute bound, e.g. MiB of RSS);
- ``""``: reported only.

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
    target: str = ""


@dataclass(frozen=True)
class Row:
    scenario: str
    metric: Metric
    hutch: Sequence[float | None]  # one value per repeat
    rabbitmq: Sequence[float | None]
    hutch_rss: Sequence[float | None] = ()  # peak RSS in bytes, one per repeat
    rabbitmq_rss: Sequence[float | None] = ()


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


HEADER = ("| scenario | metric | hutch | RabbitMQ | hutch / RabbitMQ | target | verdict "
          "| hutch RSS MiB | RabbitMQ RSS MiB |\n|---|---|---|---|---|---|---|---|---|")


def table(rows: Sequence[Row]) -> str:
    """A Markdown table, one line per row: medians, ratio, target and verdict, median peak RSS."""
    lines = [HEADER]
    for row in rows:
        h, r = median(row.hutch), median(row.rabbitmq)
        q = ratio(h, r)
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            row.scenario, row.metric.label, number(h), number(r), "-" if q is None else "%.2f" % q,
            target_text(row.metric.target), verdict(row.metric.target, h, r),
            mib(median(row.hutch_rss)), mib(median(row.rabbitmq_rss))))
    return "\n".join(lines)
