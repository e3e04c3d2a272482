"""Test fixtures: a real hutch broker process on 127.0.0.1 with port 0.

`broker` is one broker for the whole session (tests use unique names);
`fresh_broker` starts a dedicated one, and `start_broker` starts one with
extra flags or environment. Each fixture reads the port the broker logged.
Every broker runs with the default shard count (as many as the cores,
docs/scaling.md) unless a test says otherwise; with TEST_SHARDS=N in the
environment every broker (but a cluster's nodes) runs as N shards instead
(TEST_SHARDS=1: one process each).
The session broker runs on the standard library's event loop and the others
on the default one (uvloop, when it is installed), so the suite holds hutch to
the same behaviour on both.
Clients of the session broker: `conn` (pika), `aconn` (aio-pika) and `raw`
(amqp_raw.RawClient, before the protocol header); `still_serving` checks after
a test that the broker still serves a new client. `api` is the session
broker's management API (http_api.Api), `vhost` a fresh vhost on it and
`make_vhost` makes as many as a test needs.

Plain helper functions are in helpers.py (`unique` and `wait_for` are
importable from here too); how a broker process is started, logged and
stopped is server_process.py's (`ROOT` is importable from here too).

A hang never outlives its test by much: pytest-timeout fails a test after
its timeout (60 s unless marked), and if the test's own cleanup then hangs
too, `pytest_runtest_protocol` below ends the run with every thread's
stack on stderr.
"""
from __future__ import annotations

import faulthandler
import os
import re
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import pika
import pytest

from amqp_raw import RawClient
from amqp_server.process.shards import usable_cores
from helpers import assert_serves, unique, wait_for  # noqa: F401 - unique, wait_for re-exported
from http_api import Api, segment
from server_process import ROOT, ServerProcess, spawn  # noqa: F401 - ROOT re-exported
import tiers

LISTENING = re.compile(r"listening for (AMQPS?|MQTTS?|STREAMS?|HTTP|PROMETHEUS) on [^ ]+:(\d+)")
ALL_PERMISSIONS = {"configure": ".*", "write": ".*", "read": ".*"}
# Every listener on 127.0.0.1 and a free port (the management ports included).
PORT_ARGS = ("--bind", "127.0.0.1", "--port", "0", "--management-bind", "127.0.0.1", "--management-port", "0",
             "--prometheus-bind", "127.0.0.1", "--prometheus-port", "0", "--mqtt-port", "0", "--mqtt-tls-port", "0",
             "--stream-port", "0", "--stream-tls-port", "0")


@dataclass
class BrokerProcess(ServerProcess):
    process: subprocess.Popen
    ports: dict
    data_dir: Path
    log_lines: list = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.ports["AMQP"]


def launch(tmp: Path, *args: str, env: dict | None = None, expect: tuple = ("AMQP",)) -> BrokerProcess:
    """A broker on free ports (PORT_ARGS), with a fresh data directory under
    `tmp` unless `args` name one; returns once it has logged that it listens
    on every kind of port in `expect`."""
    data_dir = tmp / ("data-" + uuid.uuid4().hex[:8])
    ready = threading.Event()

    def on_line(line: str) -> None:
        match = LISTENING.search(line)
        if match:
            broker.ports[match.group(1)] = int(match.group(2))
        if not line or all(name in broker.ports for name in expect):
            ready.set()

    clustered = any(arg.startswith("--cluster") for arg in args)
    if "--shards" in args:
        shards = int(args[args.index("--shards") + 1])
    elif clustered:
        shards = 1  # a cluster node is one process by default (docs/scaling.md)
    elif "TEST_SHARDS" in os.environ:
        shards = int(os.environ["TEST_SHARDS"])  # the whole suite against nodes of that many shards
        args = (*args, "--shards", str(shards))
    else:
        shards = usable_cores()  # the default: as many as the cores
    broker = BrokerProcess(None, {}, data_dir)
    broker.process = spawn([*PORT_ARGS, "--data-dir", str(data_dir), *args], broker.log_lines, env, on_line)
    if not ready.wait(20) or not all(name in broker.ports for name in expect):
        broker.stop()
        raise RuntimeError("broker did not start:\n" + broker.log)
    try:
        wait_for(lambda: broker.log.count("listening for AMQP") >= shards, 20, what="every shard listening")
    except AssertionError:
        broker.stop()
        raise RuntimeError("broker did not start:\n" + broker.log)
    return broker


@pytest.fixture(scope="session")
def broker(tmp_path_factory) -> BrokerProcess:
    proc = launch(tmp_path_factory.mktemp("broker"), "--event-loop", "asyncio",
                  expect=("AMQP", "HTTP", "PROMETHEUS"))
    yield proc
    proc.stop()


@pytest.fixture
def start_broker(tmp_path):
    started = []

    def start(*args: str, env: dict | None = None, expect: tuple = ("AMQP",)) -> BrokerProcess:
        proc = launch(tmp_path, *args, env=env, expect=expect)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def fresh_broker(start_broker) -> BrokerProcess:
    return start_broker()


@pytest.fixture
def conn(broker):
    """A pika connection to the session broker."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        yield connection


@pytest.fixture
async def aconn(broker):
    """An aio-pika connection to the session broker."""
    connection = await aio_pika.connect(broker.url)
    yield connection
    await connection.close()


@pytest.fixture
def raw(broker):
    """A raw-socket client connected to the session broker, nothing sent yet."""
    with RawClient(broker.port) as client:
        yield client


@pytest.fixture
def still_serving(broker):
    """After the test: a new client can still connect, publish and get."""
    yield
    assert_serves(broker.port)


@pytest.fixture
def api(broker):
    """The session broker's management API, as guest (`http_api.Api`)."""
    return Api(broker.ports["HTTP"])


@pytest.fixture
def make_vhost(api):
    """make_vhost() -> the name of a fresh vhost where guest has every
    permission; each is deleted after the test."""
    made = []

    def make() -> str:
        name = unique("vh")
        assert api.put("/api/vhosts/" + segment(name)).status == 201
        # the creator has them already: 204
        assert api.put("/api/permissions/%s/guest" % segment(name), ALL_PERMISSIONS).status == 204
        made.append(name)
        return name

    yield make
    for name in made:
        api.delete("/api/vhosts/" + segment(name))


@pytest.fixture
def vhost(make_vhost):
    """A fresh vhost where guest has every permission, deleted afterwards."""
    return make_vhost()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of one test: after twice its timeout and a
    minute more, print every thread's stack and exit (a hang in cleanup)."""
    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0] if marker else item.config.getini("timeout"))
    watchdog = threading.Timer(2 * limit + 60, _hung, (item.config, item.nodeid))
    watchdog.daemon = True
    watchdog.start()
    yield
    watchdog.cancel()


def _hung(config, nodeid: str) -> None:
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=False)
    sys.stderr.write("\n%s still runs long after its timeout; every thread's stack:\n" % nodeid)
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr)
    os._exit(1)


# PySpark's driver stops answering callbacks (foreachBatch hangs) once this
# process has file descriptors numbered past select()'s limit of 1024.
SPARK_FD_BUDGET = 900
# The timeout of a test that uses `spark` (pytest_collection_modifyitems): the first such test of
# a process starts the session's JVM in its setup, 11 s on a quiet 2-core machine but over the
# suite's 60 s per test seen with both xdist workers busy and other work on the machine, and a
# session whose start was cut short fails every Spark test after it.
SPARK_TIMEOUT = 180
# Spark's driver JVMs (the `spark` fixture's, and those of the spark_sink and
# hutchctl processes tests start, which inherit the environment) compile with
# C1 only: the tests' jobs are tiny, and C2's compiling was a third of each
# JVM's start and jobs (21 s -> 13 s for a session and two small jobs). Only
# the JIT differs, not what Spark computes.
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--driver-java-options=-XX:TieredStopAtLevel=1 pyspark-shell")


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """A broker of the module whose management API samples every 0.2 s
    (RabbitMQ's 5 s would make the history tests wait), and its API."""
    broker = launch(tmp_path_factory.mktemp("sampled"), "--management-sample-interval", "0.2",
                    expect=("AMQP", "HTTP"))
    yield broker, Api(broker.ports["HTTP"])
    broker.stop()


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the suite (local[2], two shuffle partitions),
    with the hutch-dead-letters data source registered; a stopped streaming
    query gives up after a minute instead of waiting forever."""
    from spark_sink.session import build_session

    open_fds = len(os.listdir("/proc/self/fd"))
    if open_fds > SPARK_FD_BUDGET:
        pytest.fail("this test process has %d open file descriptors (a test leaks them); PySpark's "
                    "driver hangs past 1024" % open_fds)
    session = build_session("local[2]", "hutch-tests", shuffle_partitions=2)
    session.conf.set("spark.sql.streaming.stopTimeout", "60000")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def framing_c():
    """amqp_server.amqp._framing, the C twins of the hot paths; its tests skip
    where it was not built (no compiler), and fail in CI, which builds it."""
    from hutchctl_targets import unavailable

    try:
        from amqp_server.amqp import _framing
    except ImportError as exc:
        unavailable("amqp_server.amqp._framing is not built (%s)" % exc)
    from amqp_server.amqp.framing import C_VERSION

    if getattr(_framing, "VERSION", None) != C_VERSION:
        unavailable("amqp_server.amqp._framing at %s is a stale build (rebuild it in place)" % _framing.__file__)
    return _framing


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test gets its tier's marker and, with `--dist loadgroup`, its
    xdist group, which the xdist plugin keeps on one worker (tests/tiers.py).
    On an xdist worker the groups that take longest come first (the processes
    tier, the shared services, then the rest by tier, each in file order):
    with --no-loadscope-reorder xdist hands out the groups in this order, so
    the longest start early instead of ending the run alone."""
    unknown = set()
    order = {}
    for index, item in enumerate(items):
        try:
            item_tier = tiers.tier(item)
        except KeyError as exc:
            unknown.add(exc.args[0])
            continue
        name = item_tier.split(":")[0]
        item.add_marker(getattr(pytest.mark, name))
        group = tiers.group(item, item_tier)
        if getattr(config.option, "loadgroup", False):
            item.add_marker(pytest.mark.xdist_group(group))
        order[item] = (tiers.start_rank(group, item_tier), index)
        if "spark" in getattr(item, "fixturenames", ()):
            marker = item.get_closest_marker("timeout")
            if float(marker.args[0] if marker else config.getini("timeout")) < SPARK_TIMEOUT:
                item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT), append=False)
    if unknown:
        raise pytest.UsageError("tests/tiers.py gives no tier to %s: add %s to its FILES"
                                % (", ".join(sorted(unknown)), "them" if len(unknown) > 1 else "it"))
    if hasattr(config, "workerinput"):
        items.sort(key=order.__getitem__)
