"""bench/streambench, the stream-protocol load generator in C, checked from
the outside: built with its Makefile, run for a moment against a hutch, and
what it reports published, confirmed and consumed compared with what another
client (rstream) reads back from the streams it kept. So the figures it
prints for the benchmarks (docs/streams.md) count what brokers really did."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, launch
from helpers import unavailable, unique
from stream_scenarios import FIRST_SPEC, read

SOURCE = Path(ROOT) / "bench" / "streambench"
PER_PRODUCER = 5000


@pytest.fixture(scope="module")
def streambench(tmp_path_factory) -> str:
    if shutil.which("make") is None or shutil.which("cc") is None:
        unavailable("make and a C compiler are needed to build bench/streambench (tests/prepare.sh)")
    if not Path("/usr/include/zlib.h").exists():
        unavailable("zlib's headers are needed to build bench/streambench (zlib1g-dev, tests/prepare.sh)")
    build = tmp_path_factory.mktemp("streambench") / "src"
    shutil.copytree(SOURCE, build, ignore=shutil.ignore_patterns("streambench"))
    made = subprocess.run(["make", "-C", str(build)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    return str(build / "streambench")


@pytest.fixture(scope="module")
def port(tmp_path_factory) -> int:
    broker = launch(tmp_path_factory.mktemp("streambench-broker"), expect=("AMQP", "STREAM"))
    yield broker.ports["STREAM"]
    broker.stop()


def run(binary: str, port: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, "--port", str(port), "--json", "--quiet", *args], capture_output=True, text=True,
                          timeout=120)


async def test_what_it_reports_is_what_a_consumer_reads(streambench, port):
    """Two producers and two consumers on two streams, batches of 50, a
    confirm window of 500, 16-byte bodies: each producer's 5,000 messages
    are confirmed once, each consumer counts the 5,000 of its stream, and
    rstream reads exactly those back, offsets 0..4,999, bodies of 16 bytes."""
    name = unique("sb")
    done = run(streambench, port, "--stream", name, "--streams", "2", "--producers", "2", "--consumers", "2",
               "--batch", "50", "--confirm", "500", "--size", "16", "--pmessages", str(PER_PRODUCER),
               "--duration", "60", "--keep")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["errors"] == 0
    assert report["published"] == report["confirmed"] == report["consumed"] == 2 * PER_PRODUCER
    assert report["latency_ms"]["n"] > 0 and report["latency_ms"]["p50"] >= 0
    for stream in (name + "-1", name + "-2"):
        got = await read(port, stream, FIRST_SPEC, PER_PRODUCER)
        assert [offset for offset, _body in got] == list(range(PER_PRODUCER))
        assert {len(body) for _offset, body in got} == {16}


def test_a_timed_run_with_first_and_credit(streambench, port):
    """A timed run (1 s) reading from `first` with a credit of one chunk:
    everything published is consumed, and the stream is deleted after."""
    name = unique("sb")
    done = run(streambench, port, "--stream", name, "--duration", "1", "--offset", "first", "--credit", "1",
               "--size", "1024", "--batch", "10", "--confirm", "100")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["published"] > 0 and report["published"] == report["confirmed"] == report["consumed"]
    assert report["publish_rate"] > 0 and report["consume_rate"] > 0
    again = run(streambench, port, "--stream", name, "--predeclared", "--producers", "0", "--duration", "0")
    assert again.returncode != 0 and "subscribe to '%s': response code 2" % name in again.stderr


def test_it_fails_loudly(streambench, port):
    """A broker refusing the login: exit status 2 and a sentence saying so."""
    done = run(streambench, port, "--password", "wrong", "--duration", "1")
    assert done.returncode == 2
    assert "login of user 'guest' refused: response code 8" in done.stderr
