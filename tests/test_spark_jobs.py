"""The Spark jobs end to end: real clients make messages die in a real
broker (dead_letter_clients.Workload), the hutch-dead-letters source reads
the log over the management API, and each job's result is checked for exact
counts per reason and queue. Also: the report page, the CLI, and a crash of
the broker between recording dead letters and reading them."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, launch
from dead_letter_clients import Workload, delete_vhost, new_vhost
from http_api import Api, segment
from spark_sink import jobs, output, report
from spark_sink.source import NAME

COUNTS = {("orders", "rejected"): 5, ("payments", "expired"): 4, ("audit", "maxlen"): 3,
          ("retries", "delivery_limit"): 2}


@pytest.fixture(scope="module")
def dead(broker):
    """A vhost where 14 messages died, and the URL to read them."""
    vhost = new_vhost(broker)
    workload = Workload(broker, vhost)
    workload.run(rejected=5, expired=4, maxlen=3, delivery_limit=2)
    workload.close()
    yield vhost, "http://127.0.0.1:%d" % broker.ports["HTTP"]
    delete_vhost(broker, vhost)


@pytest.fixture
def df(spark, dead):
    vhost, url = dead
    return spark.read.format(NAME).option("url", url).option("vhost", vhost).option("recordsPerPartition", "4").load()


def test_the_source_reads_every_record_once_in_partitions(df):
    assert df.rdd.getNumPartitions() == 4
    rows = df.orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(14))
    assert {(r.queue, r.reason) for r in rows} == set(COUNTS)
    orders = [r for r in rows if r.queue == "orders"]
    assert all(r.exchange == "events" and r.dead_letter_exchange == "parked" for r in orders)
    assert orders[0].routing_keys == ["orders.0"] and orders[0].body == b"orders 0"
    assert orders[0].content_type == "text/plain" and orders[0].message_id.startswith("m-")


def test_reasons_counts_exactly(df):
    got = {r.reason: r["count"] for r in jobs.reasons(df).collect()}
    assert got == {"rejected": 5, "expired": 4, "maxlen": 3, "delivery_limit": 2}


def test_breakdown_per_queue_and_reason(df):
    rows = {r.queue: r.asDict() for r in jobs.breakdown(df).collect()}
    assert set(rows) == {"orders", "payments", "audit", "retries"}
    for (queue, reason), n in COUNTS.items():
        assert rows[queue][reason] == n and rows[queue]["total"] == n
        assert sum(rows[queue][r] for r in jobs.REASONS) == n
    assert rows["orders"]["share"] == round(5 * 100 / 14, 1)


def test_top_queues(df):
    rows = jobs.top_queues(df, 3).collect()
    assert [(r.queue, r["count"], r.main_reason) for r in rows] == [
        ("orders", 5, "rejected"), ("payments", 4, "expired"), ("audit", 3, "maxlen")]


def test_by_dimension_per_window(df):
    by_queue = jobs.by_dimension(df, "queue", "1 day").collect()
    assert sum(r["count"] for r in by_queue) == 14
    assert {r.queue: r["count"] for r in by_queue if r.queue == "orders"} == {"orders": 5}
    keys = {r.routing_key: r["count"] for r in jobs.by_dimension(df, "routing_key", "1 day").collect()}
    assert keys["orders.0"] == 1 and len(keys) == 14
    assert [(r.exchange, r["count"]) for r in jobs.by_dimension(df, "exchange", "1 day").collect()] == [("events", 14)]


def test_delivery_counts_and_samples(df):
    stats = {r.reason: r for r in jobs.delivery_counts(df).collect()}
    assert stats["delivery_limit"].max_delivery_count == 1  # x-delivery-count when it died
    assert stats["rejected"].max_deaths == 1 and stats["rejected"]["count"] == 5
    samples = jobs.samples(df, 2).collect()
    assert sorted((s.reason, s.queue) for s in samples) == sorted(
        [(reason, queue) for (queue, reason), n in COUNTS.items() for _ in range(min(n, 2))])
    assert all(s.body_preview.startswith(s.queue) for s in samples)


def test_report_page_has_charts_and_exact_numbers(df):
    data = report.gather(df, jobs.JobOptions(window="1 day", top=5, samples=1), "Dead letters", "test broker")
    page = report.render(data)
    assert data.total == 14 and (data.first_offset, data.last_offset) == (0, 13)
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 4
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing to fetch
    assert "<title>rejected: 5</title>" in page and "<title>expired: 4</title>" in page
    assert '<div class="card"><b>14</b><span>dead letters</span></div>' in page


@pytest.mark.timeout(240)  # a Spark of its own, on a shared machine
def test_cli_writes_the_report(dead, tmp_path):
    vhost, url = dead
    html = tmp_path / "report.html"
    out = subprocess.run([sys.executable, "-m", "spark_sink", "report", "--url", url, "--vhost", vhost,
                          "--master", "local[2]", "--shuffle-partitions", "2", "--output", str(html), "--window", "1 day"],
                         cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert out.returncode == 0, out.stderr
    assert "14 dead letters" in out.stdout and html.read_text().count("<svg") == 4


def test_terminal_table_and_csv(df, tmp_path):
    lines = output.write(jobs.breakdown(df), "table", None).splitlines()
    assert lines[0].split() == ["vhost", "queue", "rejected", "expired", "maxlen", "delivery_limit", "total", "share"]
    assert any(line.split()[1:7] == ["orders", "5", "0", "0", "0", "5"] for line in lines[2:])
    assert lines[-1] == "(4 rows)"
    output.write(jobs.reasons(df), "csv", str(tmp_path / "reasons"))
    (part,) = [p for p in os.listdir(tmp_path / "reasons") if p.endswith(".csv")]
    text = (tmp_path / "reasons" / part).read_text().splitlines()
    assert text[0] == "reason,count,percent" and "rejected,5,35.7" in text


def test_cli_says_what_is_wrong(dead, tmp_path):
    vhost, url = dead
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["JAVA_HOME"] = str(tmp_path / "no-java")
    out = subprocess.run([sys.executable, "-m", "spark_sink", "reasons", "--url", url], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and "install a JRE" in out.stderr and "default-jre-headless" in out.stderr
    out = subprocess.run([sys.executable, "-m", "spark_sink", "report", "--url", url], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--output is needed" in out.stderr


def test_dead_letters_recorded_before_sigkill_are_all_read_after_restart(spark, tmp_path):
    broker = launch(tmp_path, expect=("AMQP", "HTTP"))
    try:
        workload = Workload(broker, "/")
        made = workload.run(rejected=3, expired=2, maxlen=4, delivery_limit=1)
        workload.close()
    finally:
        broker.process.send_signal(signal.SIGKILL)
        broker.process.wait()
    again = launch(tmp_path, "--data-dir", str(broker.data_dir), expect=("AMQP", "HTTP"))
    try:
        df = spark.read.format(NAME).option("url", "http://127.0.0.1:%d" % again.ports["HTTP"]).load()
        got = {(r.queue, r.reason): r["count"] for r in df.groupBy("queue", "reason").count().collect()}
        assert got == dict(made)
        assert sorted(r.offset for r in df.select("offset").collect()) == list(range(10))
    finally:
        again.stop()


def test_the_jobs_count_the_dead_letters_of_every_shard(spark, start_broker):
    """A node of two shards keeps one dead-letter log (docs/analytics.md, "On a
    node of several shards"): the jobs count what died in queues of both."""
    node = start_broker("--shards", "2", expect=("AMQP", "HTTP"))
    vhost = new_vhost(node)
    workload = Workload(node, vhost)
    workload.run(rejected=5, expired=4, maxlen=3, delivery_limit=2)
    workload.close()
    api = Api(node.ports["HTTP"])
    shard_of = {row["name"]: row["shard"] for row in api.get("/api/queues/" + segment(vhost)).body}
    assert {shard_of[queue] for queue, _reason in COUNTS} == {0, 1}
    df = (spark.read.format(NAME).option("url", "http://127.0.0.1:%d" % node.ports["HTTP"]).option("vhost", vhost)
          .option("recordsPerPartition", "4").load())
    assert sorted((r.queue, r.reason) for r in df.collect()) == sorted(
        key for key, n in COUNTS.items() for _ in range(n))
    assert {r.reason: r["count"] for r in jobs.reasons(df).collect()} == {
        "rejected": 5, "expired": 4, "maxlen": 3, "delivery_limit": 2}
