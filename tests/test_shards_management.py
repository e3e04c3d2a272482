"""The management face of a node of several shards (docs/management.md,
"Management on a node of several shards"): a real `--shards 2` broker, pika
clients opened until both shards hold some (the "shard" field of each
connection says where it landed), and the HTTP API, hutchctl and /metrics
on shard 0 showing every shard's connections, channels, consumers and
queues, and acting on another shard's objects (closing a connection,
getting and purging messages of its queue, AMQP queue.purge across shards),
a connection that moves to another shard listed with its new shard, and
the node's one dead-letter log holding what died on either shard.
"""
from __future__ import annotations

import base64
import json
import os
import re
import resource
import signal
import time
import urllib.request

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker

from browser import Ui, require_chromium
from conftest import launch
from helpers import unique, wait_for as _wait_for
from http_api import Api, segment
from hutchctl_targets import hutch_target


def wait_for(predicate, timeout: float, what: str):
    """Poll at HTTP's pace (each poll is a request)."""
    return _wait_for(predicate, timeout=timeout, interval=0.05, what=what)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    # connections stay where they land (shard_moves off): each test picks the shard of its objects
    proc = launch(tmp_path_factory.mktemp("shards"), "--shards", "2", "--shard-moves", "false",
                  "--management-sample-interval", "0.2", expect=("AMQP", "HTTP", "PROMETHEUS"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def api(node):
    return Api(node.ports["HTTP"])


def _rows(api, path: str) -> list:
    reply = api.get(path)
    assert reply.status == 200, reply
    return reply.body


def _named(api, name: str) -> dict | None:
    """The connection row whose client_properties carry `name` (pika's connection_name)."""
    for row in _rows(api, "/api/connections"):
        if (row.get("client_properties") or {}).get("connection_name") == name:
            return row
    return None


def _spread(node, api, user: str = "guest", password: str = "guest") -> dict:
    """shard -> a pika connection of `user` held by that shard (opened until both have one)."""
    held, extra = {}, []
    for _attempt in range(40):
        name = unique("c")
        params = pika.URLParameters(node.url)
        params.credentials = pika.PlainCredentials(user, password)
        params.client_properties = {"connection_name": name}
        connection = pika.BlockingConnection(params)
        connection.listed_as = name
        row = wait_for(lambda: _named(api, name), timeout=10, what="connection %s listed" % name)
        if row["shard"] in held:
            extra.append(connection)
        else:
            held[row["shard"]] = connection
        if len(held) == 2:
            break
    for connection in extra:
        connection.close()
    assert set(held) == {0, 1}, "no connection landed on shard 1 in 40 tries"
    return held


@pytest.fixture
def clients(node, api):
    held = _spread(node, api)
    yield held
    for connection in held.values():
        if connection.is_open:
            connection.close()


def _queue_on(api, channel, shard: int, arguments: dict | None = None, durable: bool = False) -> str:
    """A queue placed on `shard` (a new queue goes to the shard with the
    fewest: declare until one lands there, then delete the others)."""
    missed = []
    try:
        for _attempt in range(20):
            name = unique("q")
            channel.queue_declare(name, durable=durable, arguments=arguments)
            row = wait_for(lambda: _queue_row(api, name), timeout=10, what="queue %s listed" % name)
            if row["shard"] == shard:
                return name
            missed.append(name)
        raise AssertionError("no queue placed on shard %d in 20 tries" % shard)
    finally:
        for name in missed:
            channel.queue_delete(name)


def _queue_row(api, name: str) -> dict | None:
    reply = api.get("/api/queues/%2F/" + segment(name))
    return reply.body if reply.status == 200 else None


def _publish(channel, queue: str, n: int, persistent: bool = False) -> None:
    channel.confirm_delivery()
    for i in range(n):
        channel.basic_publish("", queue, b"m%d" % i, pika.BasicProperties(delivery_mode=2 if persistent else 1))


def _metrics(node) -> dict:
    """/metrics as {name: value} (the aggregated endpoint: one unlabelled sample per node figure)."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % node.ports["PROMETHEUS"]) as answer:
        text = answer.read().decode()
    return {name: float(value) for name, value in re.findall(r"^(\w+) (\S+)$", text, re.M)}


def _open_by_churn(api) -> bool:
    """Whether the node's churn says as many connections are open as are."""
    overview = api.get("/api/overview").body
    churn = overview["churn_rates"]
    return churn["connection_created"] - churn["connection_closed"] == overview["object_totals"]["connections"]


def _shard_pid(node, shard: int) -> int:
    return int(re.findall(r"shard %d of 2: pid (\d+)" % shard, node.log)[-1])


def test_listings_show_every_shards_connections_channels_consumers_and_queues(node, api, clients):
    far = clients[1].channel()
    remote = _queue_on(api, far, 1)
    _publish(far, remote, 3)
    near = clients[0].channel()
    tag = near.basic_consume(remote, lambda *args: None, auto_ack=False)  # a consumer on shard 0, queue on 1
    rows = _rows(api, "/api/connections")
    assert {row["shard"] for row in rows} >= {0, 1}
    assert {row["node"] for row in rows} == {api.get("/api/overview").body["node"]}  # "node" as it was
    wait_for(lambda: {row["shard"] for row in _rows(api, "/api/channels")} >= {0, 1}, timeout=10,
             what="channels of both shards listed")
    far_name = _named(api, clients[1].listed_as)["name"]
    listed = wait_for(lambda: _rows(api, "/api/connections/%s/channels" % segment(far_name)), timeout=10,
                      what="the channel of shard 1's connection")
    assert [(row["number"], row["shard"]) for row in listed] == [(far.channel_number, 1)]
    one_channel = api.get("/api/channels/" + segment(listed[0]["name"])).body
    assert one_channel["shard"] == 1 and one_channel["consumer_details"] == []
    assert any(row["consumer_tag"] == tag and row["shard"] == 0 and row["queue"]["name"] == remote
               for row in _rows(api, "/api/consumers"))

    def settled() -> dict | None:
        row = next((q for q in _rows(api, "/api/queues") if q["name"] == remote), None)
        return row if row is not None and row["consumers"] == 1 and row["messages"] == 3 else None

    row = wait_for(settled, timeout=10, what="queue on shard 1 with its owner's counts")
    assert row["shard"] == 1
    assert row["messages_unacknowledged"] == 3  # the consumer on shard 0 holds them (prefetch unlimited)
    assert row["message_stats"]["publish"] == 3
    one = api.get("/api/queues/%2F/" + segment(remote)).body
    assert one["shard"] == 1 and one["consumers"] == 1
    assert [c["consumer_tag"] for c in one["consumer_details"]] == [tag]

    def same_row() -> bool:  # the listing (shard 1's report, packed) shows what the owner gives when asked
        listed = next(q for q in _rows(api, "/api/queues") if q["name"] == remote)
        fresh = api.get("/api/queues/%2F/" + segment(remote)).body
        return listed == {key: value for key, value in fresh.items()
                          if key not in ("consumer_details", "deliveries", "incoming")} or (listed, fresh)

    assert wait_for(lambda: same_row() is True, timeout=10, what="the listed row to equal the owner's")
    overview = api.get("/api/overview").body
    assert overview["shards"] == 2
    assert overview["object_totals"]["connections"] >= 2
    assert overview["queue_totals"]["messages_unacknowledged"] >= 3
    assert api.get("/api/nodes").body[0]["shards"] == 2
    # with a range (the UI's charts): samples from the owner, and summed over the shards in the overview
    ranged = "?lengths_age=60&lengths_incr=5&msg_rates_age=60&msg_rates_incr=5"

    def newest(details: dict) -> int:
        return details["samples"][0]["sample"]

    wait_for(lambda: newest(api.get("/api/queues/%2F/" + segment(remote) + ranged).body["messages_details"]) == 3,
             timeout=10, what="the owner's samples of the queue")
    totals = api.get("/api/overview" + ranged).body["queue_totals"]
    assert newest(totals["messages_unacknowledged_details"]) >= 3


def test_a_connection_of_the_other_shard_is_closed_through_the_api(node, api, clients):
    connection = clients[1]
    row = _named(api, connection.listed_as)
    path = "/api/connections/" + segment(row["name"])
    assert api.get(path).body["shard"] == 1
    reply = api.delete(path, headers={"X-Reason": "bye from shard 0"})
    assert reply.status == 204, reply
    with pytest.raises(ConnectionClosedByBroker) as closed:
        wait_for(lambda: connection.process_data_events(0.05), timeout=10, what="the client to see its close")
    assert closed.value.args == (320, "CONNECTION_FORCED - bye from shard 0")
    wait_for(lambda: api.get(path).status == 404, timeout=10, what="the connection gone from the listing")


def test_get_and_purge_of_a_queue_on_the_other_shard(node, api, clients):
    far = clients[1].channel()
    remote = _queue_on(api, far, 1)
    _publish(far, remote, 4)
    path = "/api/queues/%2F/" + segment(remote)
    got = api.post(path + "/get", {"count": 2, "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert got.status == 200, got
    assert [m["payload"] for m in got.body] == ["m0", "m1"]
    assert got.body[-1]["message_count"] == 2
    wait_for(lambda: _queue_row(api, remote)["messages"] == 2, timeout=10, what="two messages left")
    assert api.delete(path + "/contents").status == 204
    wait_for(lambda: _queue_row(api, remote)["messages"] == 0, timeout=10, what="the queue purged")
    # AMQP queue.purge from shard 0 of a queue on shard 1: purge-ok counts the owner's messages
    _publish(far, remote, 5)
    near = clients[0].channel()
    assert near.queue_purge(remote).method.message_count == 5
    assert near.basic_get(remote, auto_ack=True) == (None, None, None)


def test_hutchctl_and_prometheus_show_both_shards(node, api, clients):
    far, near = clients[1].channel(), clients[0].channel()
    on_one, on_zero = _queue_on(api, far, 1), _queue_on(api, near, 0)
    _publish(far, on_one, 2)
    _publish(near, on_zero, 1)
    wait_for(lambda: any(q["name"] == on_one and q["messages"] == 2 for q in _rows(api, "/api/queues")),
             timeout=10, what="shard 1's report")
    target = hutch_target(node)
    listed = target.ok("list_queues", "name", "messages", "--formatter", "json")
    counts = {row["name"]: row["messages"] for row in json.loads(listed)}
    assert counts[on_one] == 2 and counts[on_zero] == 1
    names = {row["client_properties"]["connection_name"] for row in _rows(api, "/api/connections")}
    connections = target.ok("list_connections", "client_properties", "--formatter", "json")
    assert all(name in connections for name in names)
    tag = far.basic_consume(on_zero, lambda *args: None)  # a consumer on shard 1
    wait_for(lambda: tag in target.ok("list_consumers", "consumer_tag"), timeout=10, what="hutchctl lists it")
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics/per-object" % node.ports["PROMETHEUS"]) as answer:
        text = answer.read().decode()
    assert 'rabbitmq_queue_messages_ready{vhost="/",queue="%s"} 2' % on_one in text
    assert 'rabbitmq_queue_messages{vhost="/",queue="%s"} 1' % on_zero in text  # ready or held by shard 1
    assert 'rabbitmq_queue_consumers{vhost="/",queue="%s"} 1' % on_zero in text


def test_a_management_user_sees_and_closes_only_its_own_connections_on_every_shard(node, api, clients):
    user = unique("alice")
    assert api.put("/api/users/" + user, {"password": "pw", "tags": "management"}).status == 201
    assert api.put("/api/permissions/%2F/" + user, {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
    own = _spread(node, api, user, "pw")
    try:
        alice = api.as_user(user, "pw")
        mine = {own[shard].listed_as for shard in own}
        wait_for(lambda: {(r["client_properties"] or {}).get("connection_name")
                          for r in _rows(alice, "/api/connections")} == mine, timeout=10,
                 what="the user's own connections of both shards, and no other")
        clients[1].channel()
        wait_for(lambda: any(r["shard"] == 1 and r["user"] == "guest" for r in _rows(api, "/api/channels")),
                 timeout=10, what="guest's channel on shard 1 listed")
        assert {r["user"] for r in _rows(alice, "/api/channels")} <= {user}
        guests = _named(api, clients[1].listed_as)
        path = "/api/connections/" + segment(guests["name"])
        assert alice.get(path).status == 401
        assert alice.delete(path).status == 401
        assert clients[1].is_open
        theirs = _named(api, own[1].listed_as)
        assert alice.delete("/api/connections/" + segment(theirs["name"])).status == 204
    finally:
        for connection in own.values():
            if connection.is_open:
                try:
                    connection.close()
                except pika.exceptions.AMQPError:
                    pass
        api.delete("/api/users/" + user)


def test_the_ui_shows_the_shard_of_each_queue_and_connection(node, api, clients):
    require_chromium()
    remote = _queue_on(api, clients[1].channel(), 1)
    wait_for(lambda: {row["shard"] for row in _rows(api, "/api/connections")} >= {0, 1}, timeout=10,
             what="connections of both shards listed")
    ui = Ui(node.ports["HTTP"])
    try:
        ui.login("guest", "guest")
        ui.one("#tab-queues")
        ui.open("queues")
        ui.filter(remote)
        ui.wait(lambda: ui.texts("#queues thead th")[-1:] == ["Shard"], "a Shard column")
        ui.wait(lambda: [(row[1], row[-1]) for row in _table(ui, "#queues")] == [(remote, "1")],
                "the queue on shard 1")
        ui.open("connections")
        ui.wait(lambda: {row[-1] for row in _table(ui, "#connections")} >= {"0", "1"},
                "connections of both shards, each with its shard")
    finally:
        ui.close()


def _table(ui, css: str) -> list[list[str]]:
    return ui.driver.execute_script("""
        return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'),
                          r => Array.from(r.cells, c => c.innerText))""", css)


def test_a_shard_that_does_not_answer_is_shown_as_it_last_reported(node, api, clients):
    far = clients[1].channel()
    remote = _queue_on(api, far, 1)
    _publish(far, remote, 2)
    published = time.monotonic()

    def reported_since() -> bool:  # shard 1's periodic report (the fallback) was made after the publishes
        return api.get("/api/nodes").body[0]["shard_reports"]["1"]["report_age"] < time.monotonic() - published

    wait_for(reported_since, timeout=10, what="a report of shard 1 made after the publishes")
    pid = _shard_pid(node, 1)
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        listed = next(q for q in _rows(api, "/api/queues") if q["name"] == remote)
        assert time.monotonic() - started < 5  # the listing does not wait for the stopped shard
        assert (listed["shard"], listed["messages"]) == (1, 2)
        assert _named(api, clients[1].listed_as)["shard"] == 1
    finally:
        os.kill(pid, signal.SIGCONT)


def test_churn_of_connections_and_channels_on_every_shard_is_the_nodes(node, api):
    def churn() -> dict:
        return api.get("/api/overview").body["churn_rates"]

    wait_for(lambda: _open_by_churn(api), timeout=10, what="the closes of earlier tests counted")
    before = churn()
    opened = []
    try:
        for _attempt in range(40):  # each with a channel, until one was served by shard 1
            name = unique("churn")
            params = pika.URLParameters(node.url)
            params.client_properties = {"connection_name": name}
            connection = pika.BlockingConnection(params)
            opened.append(connection)
            connection.channel()
            if wait_for(lambda: _named(api, name), timeout=10, what="connection %s listed" % name)["shard"] == 1:
                break
        assert len(opened) < 40, "no connection landed on shard 1"
        wait_for(lambda: api.get("/api/overview").body["object_totals"]["channels"] >= len(opened), timeout=10,
                 what="the channels of both shards counted")
        assert api.get("/api/overview").body["object_totals"]["connections"] >= len(opened)
    finally:
        for connection in opened:
            connection.close()
    wait_for(lambda: churn()["connection_closed"] - before["connection_closed"] == len(opened), timeout=10,
             what="every close counted, shard 1's too")
    after = churn()
    for key in ("connection_created", "channel_created", "channel_closed"):
        assert after[key] - before[key] == len(opened), key
    assert after["connection_created_details"]["rate"] >= 0
    metrics = _metrics(node)
    assert metrics["rabbitmq_connections_opened_total"] == after["connection_created"]
    assert metrics["rabbitmq_channels_closed_total"] == after["channel_closed"]


def test_the_nodes_memory_descriptors_and_sockets_add_up_its_shards(node, api, clients):
    info = api.get("/api/nodes").body[0]
    shards = info["shard_reports"]
    assert set(shards) == {"0", "1"} and all(shard["running"] for shard in shards.values())
    assert shards["1"]["os_pid"] == str(_shard_pid(node, 1)) != shards["0"]["os_pid"]
    for key in ("mem_used", "fd_used", "sockets_used"):  # one request: the sum of what it shows by shard
        assert info[key] == shards["0"][key] + shards["1"][key], key
        assert shards["1"][key] > 0, key  # shard 1 holds one of `clients`
    assert info["mem_used"] > shards["0"]["mem_used"] and info["fd_used"] > shards["0"]["fd_used"]
    assert info["fd_total"] == 2 * resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # two processes' (ours, inherited)
    metrics = _metrics(node)
    # shard 1's tens of MB are in the node's memory, whatever shard 0's moved meanwhile
    assert metrics["rabbitmq_process_resident_memory_bytes"] > shards["0"]["mem_used"] + shards["1"]["mem_used"] / 2
    assert metrics["rabbitmq_process_open_tcp_sockets"] >= 2


def test_the_memory_alarm_weighs_the_whole_nodes_memory_on_every_shard(node, api, clients):
    shards = api.get("/api/nodes").body[0]["shard_reports"]
    low, high = sorted(shards[index]["mem_used"] for index in ("0", "1"))
    limit = high + low // 2  # above what either shard holds, below what the node holds
    publisher = clients[1]
    try:
        assert api.put("/api/hutch/vm-memory-high-watermark", {"value": str(limit)}).status == 204
        info = api.get("/api/nodes").body[0]
        assert info["mem_alarm"] and info["mem_limit"] == limit and info["mem_used"] > limit
        for shard in info["shard_reports"].values():  # each under the watermark, each alarmed: the node is over
            assert shard["mem_alarm"] and shard["mem_used"] < limit, shard
        publisher.channel().basic_publish("", unique("nowhere"), b"held")  # shard 1 holds its publisher
        wait_for(lambda: _named(api, publisher.listed_as)["state"] == "blocked", timeout=10,
                 what="shard 1's publisher blocked")
    finally:
        assert api.put("/api/hutch/vm-memory-high-watermark", {"value": 0.4}).status == 204
    info = api.get("/api/nodes").body[0]
    assert not info["mem_alarm"] and not any(shard["mem_alarm"] for shard in info["shard_reports"].values())
    wait_for(lambda: _named(api, publisher.listed_as)["state"] == "running", timeout=10,
             what="shard 1's publisher running again")


def test_a_shard_that_ended_shows_its_queues_down_until_it_reports_again(node, api):
    require_chromium()
    held = _spread(node, api)
    far = held[1].channel()
    remote = _queue_on(api, far, 1, durable=True)
    _publish(far, remote, 2, persistent=True)
    path = "/api/queues/%2F/" + segment(remote)
    wait_for(lambda: _queue_row(api, remote)["messages"] == 2, timeout=10, what="the queue's messages reported")
    victim = _shard_pid(node, 1)
    node.process.send_signal(signal.SIGSTOP)  # the supervisor restarts shard 1 only once it runs again
    try:
        os.kill(victim, signal.SIGKILL)

        def listed() -> dict:
            return next(q for q in _rows(api, "/api/queues") if q["name"] == remote)

        row = wait_for(lambda: listed()["state"] == "down" and listed(), timeout=10, what="the queue down")
        assert row["shard"] == 1 and row["durable"] is True
        assert not {"messages", "messages_ready", "consumers", "message_stats"} & set(row)  # no figures
        page = api.get(path)
        assert page.status == 200 and page.body["state"] == "down" and "messages" not in page.body
        assert api.get("/api/nodes").body[0]["shard_reports"]["1"]["running"] is False
        assert api.get("/api/overview").status == 200
        target = hutch_target(node)
        offline = target.ok("list_queues", "name", "state", "messages", "--offline", "--formatter", "json")
        assert json.loads(offline) == [{"name": remote, "state": "down", "messages": ""}]  # no figures
        assert remote not in target.ok("list_queues", "name", "--online")
        ui = Ui(node.ports["HTTP"])
        try:
            ui.login("guest", "guest")
            ui.open("queues")
            ui.filter(remote)
            ui.wait(lambda: [(row[1], row[5], row[6]) for row in _table(ui, "#queues")] == [(remote, "down", "")],
                    "the queue down, with no counts")
        finally:
            ui.close()
    finally:
        node.process.send_signal(signal.SIGCONT)
        held[0].close()
    wait_for(lambda: _queue_row(api, remote)["state"] == "running", timeout=20, what="the queue running again")
    assert wait_for(lambda: _queue_row(api, remote)["messages"] == 2, timeout=10, what="its messages back")
    shard = api.get("/api/nodes").body[0]["shard_reports"]["1"]
    assert shard["running"] is True and shard["os_pid"] != str(victim)


def _dead_letters(api, start: int) -> list:
    reply = api.get("/api/hutch/dead-letters/%%2F?start=%d" % start)
    assert reply.status == 200, reply
    return reply.body["records"]


def _reject(channel, queue: str, message_id: str) -> None:
    """One message into `queue` (confirmed), got and rejected without requeue: it dies."""
    channel.confirm_delivery()
    channel.basic_publish("", queue, message_id.encode(), pika.BasicProperties(message_id=message_id))
    method, _props, _body = channel.basic_get(queue)
    channel.basic_reject(method.delivery_tag, requeue=False)


def test_messages_dead_lettered_on_either_shard_are_in_the_nodes_one_log(node, api, clients):
    far, near = clients[1].channel(), clients[0].channel()
    dlx = unique("dlx")
    near.exchange_declare(dlx, "fanout")
    parked = _queue_on(api, far, 1)  # the dead-letter queue, on shard 1
    near.queue_bind(parked, dlx)
    on_one = _queue_on(api, far, 1, {"x-dead-letter-exchange": dlx})
    on_zero = _queue_on(api, near, 0, {"x-dead-letter-exchange": dlx})
    bounds = api.get("/api/hutch/dead-letters/%2F?limit=0").body
    start = bounds["next_offset"]
    _reject(far, on_one, "died-on-1")  # the owner, shard 1, dead-letters it
    # A reject has no answer: the second dies after the first only once the first is in the log.
    wait_for(lambda: len(_dead_letters(api, start)) == 1, timeout=10, what="the first dead letter in the log")
    _reject(near, on_zero, "died-on-0")
    wait_for(lambda: len(_dead_letters(api, start)) == 2, timeout=10, what="both dead letters in the log")
    records = _dead_letters(api, start)
    # one offset sequence, in the order they died, the API's shape whatever shard recorded them
    assert [(r["offset"], r["queue"], r["reason"], r["properties"]["message_id"], r["dead_letter_exchange"])
            for r in records] == [(start, on_one, "rejected", "died-on-1", dlx),
                                  (start + 1, on_zero, "rejected", "died-on-0", dlx)]
    assert base64.b64decode(records[0]["body"]) == b"died-on-1"
    paged = api.get("/api/hutch/dead-letters/%%2F?start=%d&limit=1" % (start + 1)).body
    assert [r["queue"] for r in paged["records"]] == [on_zero] and paged["next_offset"] == start + 2
    listed = hutch_target(node).ok("list_dead_letters", "--from", str(start), "offset", "queue", "message_id",
                                   "--formatter", "json")
    assert [(row["offset"], row["queue"], row["message_id"]) for row in json.loads(listed)] == [
        (start, on_one, "died-on-1"), (start + 1, on_zero, "died-on-0")]
    # replaying shard 1's dead-letter queue (the UI's "Replay a dead-letter queue": a move)
    wait_for(lambda: _queue_row(api, parked)["messages"] == 2, timeout=10, what="both in the dead-letter queue")
    target = _queue_on(api, near, 0)
    moved = api.post("/api/queues/%2F/" + segment(parked) + "/move", {"destination": {"queue": target}})
    assert (moved.status, moved.body) == (200, {"moved": 2}), moved
    wait_for(lambda: _queue_row(api, target)["messages"] == 2, timeout=10, what="both replayed")


def test_the_dead_letter_log_answers_while_a_shard_is_stopped(node, api, clients):
    far = clients[1].channel()
    on_one = _queue_on(api, far, 1)
    start = api.get("/api/hutch/dead-letters/%2F?limit=0").body["next_offset"]
    _reject(far, on_one, "before-the-stop")
    wait_for(lambda: len(_dead_letters(api, start)) == 1, timeout=10, what="the dead letter in the log")
    pid = _shard_pid(node, 1)
    os.kill(pid, signal.SIGSTOP)
    try:  # shard 0 holds the node's log: nothing to wait for from shard 1
        assert [r["queue"] for r in _dead_letters(api, start)] == [on_one]
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_connection_that_moves_is_listed_on_its_new_shard(start_broker):
    moving = start_broker("--shards", "2", expect=("AMQP", "HTTP"))  # shard_moves on: the default
    api = Api(moving.ports["HTTP"])
    clients = _spread(moving, api)
    try:
        remote = _queue_on(api, clients[1].channel(), 1)
        channel = clients[0].channel()
        tag = channel.basic_consume(remote, lambda *args: None)  # its first consumer is for shard 1's queue

        def moved() -> bool:
            clients[0].process_data_events(0)
            rows = _rows(api, "/api/consumers")
            return (_named(api, clients[0].listed_as)["shard"] == 1
                    and [row["shard"] for row in rows if row["consumer_tag"] == tag] == [1])

        wait_for(moved, timeout=10, what="the connection and its consumer listed on shard 1")
        assert [row["shard"] for row in _rows(api, "/api/channels")
                if row["connection_details"]["name"] == _named(api, clients[0].listed_as)["name"]] == [1]
        # a moved connection was created once (where it was accepted)
        wait_for(lambda: _open_by_churn(api), timeout=10, what="connections created less closed to be those open")
    finally:
        for connection in clients.values():
            connection.close()
