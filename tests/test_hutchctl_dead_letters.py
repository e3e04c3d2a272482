"""hutchctl and the dead-letter log: `list_dead_letters` prints the log as a
rabbitmqctl table after pika clients made messages die (rejected without
requeue, expired, dropped by a length limit), and `dead_letters JOB` runs a
real Spark job (python -m spark_sink) with hutchctl's URL, vhost and
credentials, streaming its output and returning its exit status. hutchctl
runs as a subprocess against the session broker."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dead_letter_clients import Workload, delete_vhost, new_vhost
from helpers import unique
from http_api import Api, segment
from hutchctl_targets import ROOT, clean_environ, hutchctl, rabbitmq_target

DEFAULT_COLUMNS = ["offset", "time", "queue", "reason", "exchange", "routing_keys", "dead_letter_exchange",
                   "death_count", "message_id", "body_size"]


@pytest.fixture(scope="module")
def dead(broker):
    """A vhost where 3 messages were rejected, 2 expired and 4 overflowed; yields (vhost, API URL)."""
    vhost = new_vhost(broker)
    workload = Workload(broker, vhost)
    workload.run(rejected=3, expired=2, maxlen=4)
    workload.close()
    yield vhost, "http://127.0.0.1:%d" % broker.ports["HTTP"]
    delete_vhost(broker, vhost)


def ctl(url: str, *args: str) -> subprocess.CompletedProcess:
    return hutchctl("--url", url, *args)


def test_list_dead_letters_prints_the_log_as_a_table(dead):
    vhost, url = dead
    result = ctl(url, "-p", vhost, "list_dead_letters")
    assert result.returncode == 0, result.stderr
    banner, header, *lines = result.stdout.splitlines()
    assert banner == "Listing dead letters for vhost %s ..." % vhost
    assert header.split("\t") == DEFAULT_COLUMNS
    rows = [dict(zip(DEFAULT_COLUMNS, line.split("\t"))) for line in lines]
    assert [row["offset"] for row in rows] == [str(n) for n in range(9)]
    # rejections come first (the clients wait for them); expiry and overflow may interleave
    assert [(row["queue"], row["reason"]) for row in rows[:3]] == [("orders", "rejected")] * 3
    assert sorted((row["queue"], row["reason"]) for row in rows[3:]) == \
        [("audit", "maxlen")] * 4 + [("payments", "expired")] * 2
    first = rows[0]
    assert (first["exchange"], first["routing_keys"], first["dead_letter_exchange"]) == \
        ("events", '["orders.0"]', "parked")
    assert (first["death_count"], first["body_size"]) == ("1", str(len(b"orders 0")))
    assert first["message_id"].startswith("m-") and len(first["time"]) == len("2026-11-22 15:07:26")
    assert [row["dead_letter_exchange"] for row in rows[3:]] == [""] * 6
    silent = ctl(url, "-p", vhost, "-s", "list_dead_letters", "queue", "reason")
    assert silent.stdout.splitlines()[0] == "orders\trejected"


def test_list_dead_letters_from_an_offset_with_a_limit_and_chosen_columns(dead):
    vhost, url = dead
    result = ctl(url, "list_dead_letters", "-p", vhost, "--from", "1", "--limit", "2", "offset", "reason",
                 "routing_keys", "headers", "body", "--formatter", "json")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line.lstrip(",")) for line in result.stdout.splitlines()[1:-1]]
    assert [(r["offset"], r["reason"], r["routing_keys"]) for r in records] == [
        (1, "rejected", ["orders.1"]), (2, "rejected", ["orders.2"])]
    assert records[0]["headers"] == [] and records[0]["body"] == "b3JkZXJzIDE="  # base64 of b"orders 1"
    past_the_end = ctl(url, "-p", vhost, "-q", "list_dead_letters", "--from", "9")
    assert (past_the_end.returncode, past_the_end.stdout) == (0, "")


def test_list_dead_letters_argument_and_vhost_errors(dead):
    vhost, url = dead
    bad_column = ctl(url, "-p", vhost, "list_dead_letters", "offset", "colour")
    assert bad_column.returncode == 64 and "Info key(s) colour are not supported" in bad_column.stderr
    bad_limit = ctl(url, "-p", vhost, "list_dead_letters", "--limit", "many")
    assert bad_limit.returncode == 64 and "--limit : many" in bad_limit.stderr
    missing = ctl(url, "-p", unique("no-such-vhost"), "list_dead_letters")
    assert missing.returncode == 0 and missing.stdout.startswith("Listing dead letters for vhost no-such-vhost")
    assert len(missing.stdout.splitlines()) == 1


def test_list_dead_letters_when_the_log_is_disabled(start_broker):
    broker = start_broker("--dead-letter-log-enabled", "false", expect=("AMQP", "HTTP"))
    result = ctl("http://127.0.0.1:%d" % broker.ports["HTTP"], "list_dead_letters")
    assert result.returncode == 69
    assert "the dead-letter log is disabled (dead_letter_log.enabled)" in result.stderr


@pytest.mark.differential
def test_list_dead_letters_against_rabbitmq_says_it_is_a_hutch_extension():
    target = rabbitmq_target()
    result = target.run("list_dead_letters")
    assert result.returncode == 69
    assert "no dead-letters endpoint (a hutch extension that RabbitMQ does not provide)" in result.stderr


def test_dead_letters_hands_the_job_its_options_and_returns_its_exit_status(dead):
    vhost, url = dead
    no_output = ctl(url, "-p", vhost, "dead_letters", "report", "--window", "1 day")
    assert no_output.returncode == 2 and "spark_sink: --output is needed for html" in no_output.stderr
    assert no_output.stdout == "Running dead-letter job report for vhost %s ...\n" % vhost
    unknown = ctl(url, "dead_letters", "no-such-job")
    assert unknown.returncode == 2 and "invalid choice: 'no-such-job'" in unknown.stderr
    assert ctl(url, "dead_letters").returncode == 64


@pytest.mark.timeout(300)  # a Spark of its own, on a shared machine
def test_dead_letters_runs_a_spark_job_with_hutchctls_url_vhost_and_credentials(broker, dead):
    vhost, url = dead
    api = Api(broker.ports["HTTP"])
    reader = unique("reader")
    assert api.put("/api/users/" + reader, {"password": "pw", "tags": "management"}).status == 201
    api.put("/api/permissions/%s/%s" % (segment(vhost), reader), {"configure": "", "write": "", "read": ".*"})
    try:
        # the environment names another broker and user: only what hutchctl hands on can work
        env = clean_environ(HUTCH_URL="http://127.0.0.1:9", HUTCH_USERNAME="nobody", HUTCH_PASSWORD="wrong")
        result = subprocess.run(
            [sys.executable, "-m", "cli.hutchctl", "--url", url, "-u", reader, "--password", "pw", "-q",
             "dead_letters", "-p", vhost, "reasons", "--master", "local[2]", "--shuffle-partitions", "2"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    finally:
        api.delete("/api/users/" + reader)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[2:-1]}
    assert {reason: cells[0] for reason, cells in rows.items()} == {
        "rejected": "3", "expired": "2", "maxlen": "4", "delivery_limit": "0"}
    assert result.stdout.splitlines()[-1] == "(4 rows)"


def test_job_options_are_handed_on_as_given_and_hutchctls_own_are_taken():
    from cli.hutchctl.command import BadArgument
    from cli.hutchctl.options import parse
    from cli.hutchctl.registry import COMMANDS

    argv = ["-p", "v", "dead_letters", "reasons", "--window", "1 day", "--master=local[2]", "--once", "-q",
            "--url", "http://h:1", "--top", "-1"]
    found = parse(argv, COMMANDS["dead_letters"])
    assert found.args == ["reasons", "--window", "1 day", "--master=local[2]", "--once", "--top", "-1"]
    assert found.general == {"vhost": "v", "quiet": True, "url": "http://h:1"}
    with pytest.raises(BadArgument, match="--window : 1 day"):
        parse(["list_dead_letters", "--window=1 day"], COMMANDS["list_dead_letters"])
