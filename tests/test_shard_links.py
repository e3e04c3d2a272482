"""Links (federation, shovels) on nodes of two shards, whatever shard their
queues live on (issue #39, "Shards you can trust"; docs/links.md, "On a
node of several shards").

The links run on shard 0; a queue lives on one shard, chosen here with
tests/shard_kit.py. Two hutch nodes, A (upstream, source) and B
(downstream), each of two shards, real pika clients; every message is
persistent and published with confirms, and must arrive exactly once, in
order.
"""
from __future__ import annotations

import pika
import pytest

from conftest import launch
from helpers import pump_while_progressing, unique, wait_for
from http_api import Api, segment
from shard_kit import on_shard, placement, queue_on

pytestmark = pytest.mark.timeout(120)

COUNT = 50
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture(scope="module", params=[True, False], ids=["moves", "no-moves"])
def nodes(request, tmp_path_factory):
    """(A, B, moves): two nodes of two shards each. With shard moves (the
    default) a link's connection moves to the shard of the queue it
    consumes or publishes to; without, it stays where it landed, and each
    test restarts its link until its connections landed on the other shard
    than their queues (`crossing`), so consumes, publishes, confirms and
    acks cross shards."""
    started = []
    try:
        for name in ("a", "b"):
            started.append(launch(tmp_path_factory.mktemp(name), "--shards", "2",
                                  "--shard-moves", "true" if request.param else "false", expect=("AMQP", "HTTP")))
        yield (*started, request.param)
    finally:
        for node in started:
            node.stop()


def channel_of(node, shard: int | None = None):
    """(connection, confirm-mode channel) on `node`, on `shard` when given."""
    connection = on_shard(node.port, shard) if shard is not None else \
        pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.confirm_delivery()
    return connection, channel


def publish(channel, exchange: str, key: str, count: int = COUNT) -> None:
    for i in range(count):
        channel.basic_publish(exchange, key, b"%03d" % i, PERSISTENT)


def consume(node, queue: str, count: int = COUNT, shard: int | None = None, stall: float = 30.0) -> list[bytes]:
    """The bodies a consumer of `queue` on `node` received and acked: once
    `count` came (failing if none came for `stall` seconds), and whatever
    else came in the second after. On `shard` when given: the connection's
    other channel keeps it from moving to the queue's shard."""
    connection, _ = channel_of(node, shard)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        got: list[bytes] = []
        channel.basic_consume(queue, lambda ch, method, _p, body: (got.append(body),
                                                                   ch.basic_ack(method.delivery_tag)))
        pump_while_progressing(connection, lambda: len(got), count, stall)
        connection.process_data_events(time_limit=1.0)  # duplicates would come now
        return got
    finally:
        connection.close()


def assert_once_in_order(got: list[bytes], count: int, context=lambda: "") -> None:
    """`got` is the bodies 000, 001, ... of `count` messages, each once, in
    order; else say what is missing, duplicated and first out of place,
    and `context()`."""
    expected = [b"%03d" % i for i in range(count)]
    if got == expected:
        return
    missing = sorted(set(expected) - set(got))
    duplicated = sorted({body for body in got if got.count(body) > 1})
    first = next((i for i, (one, other) in enumerate(zip(got, expected)) if one != other), min(len(got), count))
    raise AssertionError("got %d of %d: missing %s, duplicated %s, from position %d: %s; %s" % (
        len(got), count, missing, duplicated, first, got[first:first + 8], context()))


def named_on(node, channel, name: str, shard: int, arguments: dict | None = None) -> None:
    """Declare the durable queue `name` on `shard`: a new queue goes to the
    shard with the fewest queues, so fill the other shard until it lands."""
    fillers = []
    try:
        for _ in range(8):
            channel.queue_declare(name, durable=True, arguments=arguments)
            if placement(node, name) == shard:
                return
            channel.queue_delete(name)
            filler = unique("filler")
            channel.queue_declare(filler, durable=True)
            fillers.append(filler)
        raise AssertionError("queue %s not placed on shard %d" % (name, shard))
    finally:
        for filler in fillers:
            channel.queue_delete(filler)


def upstream(api, name: str, value: dict, pattern: str, apply_to: str) -> None:
    assert api.put("/api/parameters/federation-upstream/%2F/" + name, {"value": value}).status in (201, 204)
    assert api.put("/api/policies/%2F/" + name, {"pattern": pattern, "apply-to": apply_to,
                                                  "definition": {"federation-upstream": name}}).status in (201, 204)


def unfederate(api, name: str) -> None:
    api.delete("/api/policies/%2F/" + name)
    api.delete("/api/parameters/federation-upstream/%2F/" + name)


def restarter(api, name: str, value: dict, pattern: str, apply_to: str):
    """restart() for `crossing`: an upstream that changed restarts its links."""
    def restart():
        value["reconnect-delay"] += 0.01
        upstream(api, name, value, pattern, apply_to)
    return restart


def running_link(api, kind: str, name: str) -> dict:
    def found():
        return next((link for link in api.get("/api/federation-links/%2F").body
                     if link.get(kind) == name and link["status"] == "running"), None)
    return wait_for(found, 30, 0.1, "the federation link of %s %s running" % (kind, name))


def crossing(ends, restart, tries: int = 40) -> None:
    """Restart a link until each of its connections is served by the other
    shard than its queue's. `ends`: (Api of the node it reaches, its
    connection_name, its queue's shard); `restart()` starts a new session."""
    seen: set = set()  # the rows of sessions ended: their connections may still be listed

    def landed():
        rows = []
        for api, name, _shard in ends:
            row = next((row for row in api.get("/api/connections").body
                        if (row.get("client_properties") or {}).get("connection_name") == name
                        and row["name"] not in seen), None)
            if row is None:
                return None
            rows.append(row)
        return rows

    for _ in range(tries):
        rows = wait_for(landed, 30, 0.1, "the link's connections")
        seen.update(row["name"] for row in rows)
        if all(row["shard"] != shard for row, (_api, _name, shard) in zip(rows, ends)):
            return
        restart()
    raise AssertionError("the link's connections never landed away from their queues")


def ready(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


@pytest.mark.parametrize("beside", [True, False], ids=["consumer-beside-it", "consumer-on-the-other-shard"])
@pytest.mark.parametrize("down_shard", [0, 1], ids=["down-on-0", "down-on-1"])
@pytest.mark.parametrize("up_shard", [0, 1], ids=["up-on-0", "up-on-1"])
def test_a_federated_queue_feeds_its_consumer_whatever_shard_either_queue_lives_on(nodes, up_shard, down_shard,
                                                                                   beside):
    """The link (on B's shard 0) pulls only while the downstream queue wants
    messages: its consumers, wherever they are, are known on its own shard."""
    a, b, moves = nodes
    api = Api(b.ports["HTTP"])
    a_connection, a_channel = channel_of(a)
    b_connection, b_channel = channel_of(b)
    source = queue_on(a, a_channel, up_shard)
    local = queue_on(b, b_channel, down_shard)
    publish(a_channel, "", source)
    name = unique("up")
    value = {"uri": a.url, "queue": source, "reconnect-delay": 0.5}
    try:
        upstream(api, name, value, "^%s$" % local, "queues")
        link = running_link(api, "queue", local)
        assert link["upstream_queue"] == source
        if not moves:
            crossing([(Api(a.ports["HTTP"]), "Federation link %s (upstream)" % local, up_shard),
                      (api, "Federation link %s (downstream)" % local, down_shard)],
                     restarter(api, name, value, "^%s$" % local, "queues"))
            running_link(api, "queue", local)
        # nothing consumes downstream: the messages stay upstream
        assert ready(a_channel, source) == COUNT
        assert_once_in_order(consume(b, local, shard=down_shard if beside else 1 - down_shard), COUNT)
        wait_for(lambda: ready(a_channel, source) == 0, 10, 0.1, "the upstream queue acked empty")
        assert ready(b_channel, local) == 0
    finally:
        unfederate(api, name)
        a_connection.close()
        b_connection.close()


@pytest.mark.parametrize("down_shard", [0, 1], ids=["down-on-0", "down-on-1"])
@pytest.mark.parametrize("up_shard", [0, 1], ids=["up-on-0", "up-on-1"])
def test_a_federated_exchange_delivers_once_whatever_shard_the_queues_live_on(nodes, up_shard, down_shard):
    """The upstream's federation queue, which the link consumes, is placed
    before the link declares it; the downstream queue is bound to the local
    exchange."""
    a, b, moves = nodes
    api = Api(b.ports["HTTP"])
    a_connection, a_channel = channel_of(a)
    b_connection, b_channel = channel_of(b)
    exchange = unique("fx")
    for channel in (a_channel, b_channel):
        channel.exchange_declare(exchange, "direct", durable=True)
    local = queue_on(b, b_channel, down_shard)
    b_channel.queue_bind(local, exchange, "k")
    overview = api.get("/api/overview").body
    cluster_id = api.get("/api/global-parameters/internal_cluster_id").body["value"]
    federation_queue = "federation: %s to %s %s" % (exchange, overview["node"], cluster_id)
    named_on(a, a_channel, federation_queue, up_shard, {"x-internal-purpose": "federation"})
    name = unique("up")
    try:
        value = {"uri": a.url, "reconnect-delay": 0.5}
        upstream(api, name, value, "^%s$" % exchange, "exchanges")
        running_link(api, "exchange", exchange)
        a_api = Api(a.ports["HTTP"])
        if not moves:
            crossing([(a_api, "Federation link %s (upstream)" % exchange, up_shard),
                      (api, "Federation link %s (downstream)" % exchange, down_shard)],
                     restarter(api, name, value, "^%s$" % exchange, "exchanges"))
            running_link(api, "exchange", exchange)
        wait_for(lambda: any(binding["destination"] == federation_queue and binding["routing_key"] == "k"
                             for binding in a_api.get("/api/bindings/%2F").body), 30, 0.1, "the upstream binding")
        publish(a_channel, exchange, "k")
        assert_once_in_order(consume(b, local), COUNT)
        wait_for(lambda: ready(a_channel, federation_queue) == 0, 10, 0.1, "the federation queue acked empty")
    finally:
        unfederate(api, name)
        a_channel.queue_delete(federation_queue)
        a_connection.close()
        b_connection.close()


@pytest.mark.parametrize("src_shard,dest_shard", [(1, 0), (0, 1)], ids=["src-on-1-dest-on-0", "src-on-0-dest-on-1"])
@pytest.mark.parametrize("ends", ["AA", "AB", "BA"], ids=["within-a-node", "to-another-node", "from-another-node"])
def test_an_on_confirm_shovel_moves_each_message_once_in_order_between_shards(nodes, src_shard, dest_shard, ends):
    """The shovel runs on A's shard 0; its source and destination are on A
    ("amqp://") or B. It is set before the messages are published, so that
    without shard moves its connections are placed (`crossing`) before it
    moves any."""
    a, b, moves = nodes
    src_node, dest_node = ({"A": a, "B": b}[end] for end in ends)
    api = Api(a.ports["HTTP"])
    s_connection, s_channel = channel_of(src_node)
    d_connection, d_channel = channel_of(dest_node)
    source = queue_on(src_node, s_channel, src_shard)
    dest = queue_on(dest_node, d_channel, dest_shard)
    name = unique("shovel")
    value = {"src-uri": "amqp://" if src_node is a else b.url, "src-queue": source,
             "dest-uri": "amqp://" if dest_node is a else b.url, "dest-queue": dest,
             "ack-mode": "on-confirm", "src-prefetch-count": 100, "reconnect-delay": 0.5}
    try:
        assert api.put("/api/parameters/shovel/%2F/" + name, {"value": value}).status == 201
        wait_for(lambda: [s for s in api.get("/api/shovels/%2F").body if s["name"] == name
                          and s["state"] == "running"], 30, 0.1, "the shovel running")
        if not moves:
            crossing([(Api(src_node.ports["HTTP"]), "Shovel %s (source)" % name, src_shard),
                      (Api(dest_node.ports["HTTP"]), "Shovel %s (destination)" % name, dest_shard)],
                     lambda: api.delete("/api/shovels/vhost/%%2F/%s/restart" % name))
        publish(s_channel, "", source, 500)
        assert_once_in_order(consume(dest_node, dest, 500), 500, lambda: "source queue %s, shovel %s; %s" % (
            Api(src_node.ports["HTTP"]).get("/api/queues/%2F/" + source).body.get("message_stats"),
            api.get("/api/shovels/%2F").body, [line for node in (a, b) for line in node.log.splitlines()
                                               if "WARNING" in line or "ERROR" in line][-20:]))
        wait_for(lambda: ready(s_channel, source) == 0, 10, 0.1, "the source queue acked empty")
        (status,) = [s for s in api.get("/api/shovels/%2F").body if s["name"] == name]
        assert status["state"] == "running", status
    finally:
        api.delete("/api/parameters/shovel/%2F/" + segment(name))
        s_connection.close()
        d_connection.close()
