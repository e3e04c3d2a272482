"""A node of several shards limits as one node (docs/scaling.md,
amqp_server/shards/tallies.py): `connection_max`, the vhost and user
limits and the login throttle count what every shard holds. Real clients
against `--shards 2`; each test picks its connections' shards by the
`shard` server property (the kernel spreads them: SO_REUSEPORT).
"""
from __future__ import annotations

import time

import pytest
from pamqp import commands

from amqp_raw import RawClient
from conftest import launch
from helpers import unique, wait_for
from http_api import Api, call

SHARDS = 2
LIMIT_TEXT = "NOT_ALLOWED - connection refused: node connection limit (2) is reached"


@pytest.fixture
def node(tmp_path):
    started = []

    def start(*args: str):
        proc = launch(tmp_path, "--shards", str(SHARDS), *args, expect=("AMQP", "HTTP", "PROMETHEUS"))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def raw_on_shard(port: int, shard: int) -> RawClient:
    """A raw client past Connection.Start on `shard` (nothing counted of the others tried).
    Tries are paced: connections made in a quick burst tend to land on one
    shard (seen in the first tenths of a second after a start)."""
    for _ in range(200):
        client = RawClient(port)
        if client.handshake_start().server_properties["shard"] == shard:
            return client
        client.close()
        time.sleep(0.02)
    raise AssertionError("no connection landed on shard %d" % shard)


def opened_on_shard(port: int, shard: int, user: str = "guest", password: str = "guest",
                    vhost: str = "/") -> RawClient:
    """A client on `shard` that sent Connection.Open (the answer is the test's to read)."""
    client = raw_on_shard(port, shard)
    client.login(user, password)
    tune = client.expect(commands.Connection.Tune, 0)
    client.send_frames((0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max)),
                       (0, commands.Connection.Open(virtual_host=vhost)))
    return client


def refused_open(client: RawClient) -> tuple[int, str]:
    close = client.expect(commands.Connection.Close, 0)
    return close.reply_code, close.reply_text


def test_connection_max_counts_the_connections_of_every_shard(node):
    proc = node("--connection-max", "2")
    first = opened_on_shard(proc.port, 0)
    first.expect(commands.Connection.OpenOk, 0)
    second = opened_on_shard(proc.port, 1)
    second.expect(commands.Connection.OpenOk, 0)
    # a third is refused on either shard: each counts the other's connection
    for shard in range(SHARDS):
        with opened_on_shard(proc.port, shard) as third:
            assert refused_open(third) == (530, LIMIT_TEXT)
    # a slot is free again, on the other shard too, once the broker has seen the close
    first.close()
    wait_for(lambda: _opens(proc.port, 1), what="a slot freed on shard 0 is free on shard 1")
    second.close()


def _opens(port: int, shard: int) -> bool:
    with opened_on_shard(port, shard) as client:
        _channel, reply = client.read_frame()
        return isinstance(reply, commands.Connection.OpenOk)


def test_user_and_vhost_limits_count_every_shard(node):
    proc = node()
    api = Api(proc.ports["HTTP"])
    user, vhost = unique("u"), unique("v")
    api.put("/api/vhosts/" + vhost)
    api.put("/api/users/" + user, {"password": "pw", "tags": ""})
    api.put("/api/permissions/%s/%s" % (vhost, user), {"configure": ".*", "write": ".*", "read": ".*"})
    login = {"user": user, "password": "pw", "vhost": vhost}
    # channels: one on each shard; a limit of 2 refuses a third on either
    assert api.put("/api/user-limits/%s/max-channels" % user, {"value": 2}).status == 204
    first, second = [opened_on_shard(proc.port, shard, **login) for shard in range(SHARDS)]
    for client in (first, second):
        client.expect(commands.Connection.OpenOk, 0)
        client.open_channel(1)
    assert _third_channel_refused(second, user)
    # the refusal closed that connection (530), and its channel with it: shard 1 may open one again
    third = opened_on_shard(proc.port, 1, **login)
    third.expect(commands.Connection.OpenOk, 0)
    third.open_channel(1)
    assert _third_channel_refused(first, user)
    third.close()
    api.delete("/api/user-limits/%s/max-channels" % user)
    held = [opened_on_shard(proc.port, shard, **login) for shard in range(SHARDS)]
    for client in held:
        client.expect(commands.Connection.OpenOk, 0)
    assert api.put("/api/vhost-limits/%s/max-connections" % vhost, {"value": 2}).status == 204
    for shard in range(SHARDS):
        with opened_on_shard(proc.port, shard, **login) as third:
            assert refused_open(third) == (
                530, "NOT_ALLOWED - access to vhost '%s' refused for user '%s': connection limit (2) is reached"
                % (vhost, user))
    api.delete("/api/vhost-limits/%s/max-connections" % vhost)
    assert api.put("/api/user-limits/%s/max-connections" % user, {"value": 2}).status == 204
    for shard in range(SHARDS):
        with opened_on_shard(proc.port, shard, **login) as third:
            assert refused_open(third) == (
                530, "NOT_ALLOWED - connection refused for user '%s': user connection limit (2) is reached" % user)
    for client in held:
        client.close()


def _third_channel_refused(client: RawClient, user: str) -> bool:
    client.send_frame(commands.Channel.Open(), 2)
    close = client.expect(commands.Connection.Close, 0)
    client.close()
    return (close.reply_code, close.reply_text) == (
        530, "NOT_ALLOWED - number of channels opened for user '%s' has reached "
             "the maximum allowed user limit of (2)" % user)


def _refused_login_seconds(port: int, shard: int, user: str) -> float:
    with raw_on_shard(port, shard) as client:
        started = time.monotonic()
        client.login(user, "wrong")
        assert client.expect(commands.Connection.Close, 0, timeout=30).reply_code == 403
        return time.monotonic() - started


def test_refused_logins_count_over_every_shard_and_the_http_api(node):
    proc = node("--auth-failure-delay", "0.2", "--auth-failure-delay-max", "60")
    user = unique("user")
    assert _refused_login_seconds(proc.port, 1, user) >= 0.2
    assert _refused_login_seconds(proc.port, 1, user) >= 0.4
    assert _refused_login_seconds(proc.port, 0, user) >= 0.8  # shard 0 counts shard 1's
    reply = call(proc.ports["HTTP"], "GET", "/api/overview", auth=(user, "x"))  # served by shard 0
    assert reply.status == 401
    assert _refused_login_seconds(proc.port, 1, user) >= 3.2  # shard 1 counts shard 0's and HTTP's
    # an accepted login forgets the failures on every shard
    api = Api(proc.ports["HTTP"])
    api.put("/api/users/" + user, {"password": "pw", "tags": ""})
    api.put("/api/permissions/%%2F/%s" % user, {"configure": ".*", "write": ".*", "read": ".*"})
    with opened_on_shard(proc.port, 0, user=user, password="pw") as accepted:
        accepted.expect(commands.Connection.OpenOk, 0)
    assert _refused_login_seconds(proc.port, 1, user) < 3.2  # the first delay (0.2 s) again, not 6.4 s


def test_the_paging_budget_is_the_nodes_split_over_its_shards(node):
    """A node pages where one process would: each shard gets its part of the
    budget (watermark x paging ratio), and the node's figure is the whole."""
    proc = node("--storage-vm-memory-high-watermark-absolute", "400000000", "--storage-paging-ratio", "0.5")
    api = Api(proc.ports["HTTP"])
    wait_for(lambda: "os_pid" in api.get("/api/nodes").body[0]["shard_reports"]["1"], what="shard 1's report")
    metrics = call(proc.ports["PROMETHEUS"], "GET", "/metrics", auth=None).body
    budget = next(line for line in metrics.splitlines() if line.startswith("hutch_memory_budget_bytes"))
    assert float(budget.split()[-1]) == 200_000_000
