"""bench/results_table.py: medians over repeats, the hutch / RabbitMQ ratio, target verdicts and
the Markdown table the benchmark prints (pure logic; the benchmark itself is not a test)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from results_table import Metric, Row, median, number, ratio, table, verdict  # noqa: E402

RATE = Metric("consumed", "consumed msg/s", ">= 1")
LATENCY = Metric("p99", "latency p99 ms", "<= 1")
RSS = Metric("rss_mib", "peak RSS MiB", "< 150")


def test_median_skips_failed_runs():
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([4.0, None, 2.0]) == 3.0
    assert median([None, None]) is None
    assert median([]) is None


def test_ratio_is_hutch_over_rabbitmq_and_undefined_without_both():
    assert ratio(50.0, 100.0) == 0.5
    assert ratio(None, 100.0) is None
    assert ratio(50.0, None) is None
    assert ratio(50.0, 0.0) is None


def test_verdict_on_ratio_targets():
    assert verdict(">= 1", 100.0, 100.0) == "met"
    assert verdict(">= 1", 99.0, 100.0) == "missed"
    assert verdict("<= 1", 2.0, 3.0) == "met"
    assert verdict("<= 1", 3.1, 3.0) == "missed"
    assert verdict(">= 1", 100.0, None) == ""


def test_verdict_on_an_absolute_bound_needs_hutch_only():
    assert verdict("< 150", 149.9, None) == "met"
    assert verdict("< 150", 150.0, 10.0) == "missed"
    assert verdict("", 1.0, 2.0) == ""


def test_number_keeps_three_significant_figures_at_most():
    assert number(63512.4) == "63,512"
    assert number(12.34) == "12.3"
    assert number(0.8421) == "0.842"
    assert number(None) == "-"


def test_table_one_line_per_metric_with_medians_ratio_and_verdict():
    mib = 2**20
    text = table([
        Row("S1", RATE, [60000.0, 64000.0, 62000.0], [75000.0, 80000.0, None], [40 * mib, 50 * mib], [600 * mib]),
        Row("S8", LATENCY, [0.5], [1.0]),
        Row("S6", RSS, [120.0], []),
    ])
    lines = text.splitlines()
    assert lines[0].startswith("| scenario | metric | hutch | RabbitMQ | hutch / RabbitMQ | target | verdict")
    assert len(lines) == 5
    assert lines[2] == "| S1 | consumed msg/s | 62,000 | 77,500 | 0.80 | ratio >= 1 | missed | 45 | 600 |"
    assert lines[3] == "| S8 | latency p99 ms | 0.5 | 1 | 0.50 | ratio <= 1 | met | - | - |"
    assert lines[4] == "| S6 | peak RSS MiB | 120 | - | - | hutch < 150 | met | - | - |"


def test_table_with_garagemq_has_its_value_ratio_and_rss_and_names_each_verdict():
    mib = 2**20
    s1 = Metric("consumed", "consumed msg/s", ">= 2", ">= 1")
    cpu = Metric("cpu_us", "broker CPU µs per message")
    text = table([
        Row("S1", s1, [150000.0], [60000.0], [50 * mib], [500 * mib], [200000.0, 180000.0], [30 * mib]),
        Row("S1", cpu, [5.0], [14.0], [], [], [3.2], []),
        Row("S3", CONSUMED_S3, [30000.0], [10000.0]),  # garagemq did not run it
    ], garagemq=True)
    lines = text.splitlines()
    assert lines[0] == ("| scenario | metric | hutch | RabbitMQ | garagemq | hutch / RabbitMQ | hutch / garagemq "
                        "| target | verdict | hutch RSS MiB | RabbitMQ RSS MiB | garagemq RSS MiB |")
    assert lines[1].count("|") == 13
    assert lines[2] == ("| S1 | consumed msg/s | 150,000 | 60,000 | 190,000 | 2.50 | 0.79 "
                        "| RabbitMQ ratio >= 2; garagemq ratio >= 1 | RabbitMQ met; garagemq missed | 50 | 500 | 30 |")
    assert lines[3] == "| S1 | broker CPU µs per message | 5 | 14.0 | 3.2 | 0.36 | 1.56 |  |  | - | - | - |"
    assert lines[4] == "| S3 | consumed msg/s | 30,000 | 10,000 | - | 3.00 | - | RabbitMQ ratio >= 2 | RabbitMQ met | - | - | - |"


def test_an_absolute_bound_on_hutch_names_no_broker_beside_garagemq():
    assert table([Row("S6", RSS, [151.0], [])], garagemq=True).splitlines()[2] == (
        "| S6 | peak RSS MiB | 151 | - | - | - | - | hutch < 150 | missed | - | - | - |")


CONSUMED_S3 = Metric("consumed", "consumed msg/s", ">= 2")
