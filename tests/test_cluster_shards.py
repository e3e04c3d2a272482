"""Shard leaders spread over a cluster (docs/scaling.md, "Shards in a
cluster"): real etcd, three hutch nodes of three shards each, real clients.

Each shard is a replication group of its own, with its own leader: the
leaders spread over the nodes, a client reaches every queue through any
node, a node's SIGKILL moves only its shards' leadership, without losing a
confirmed message, and the node takes its share again only when asked
(`hutchctl rebalance`). The views (cluster_status, /api/nodes, /api/queues,
Prometheus) say which node leads which shard.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pika
import pytest

from browser import Ui, require_chromium
from cluster_kit import (ROOT, EtcdProcess, Load, etcd_get, free_port_run, groups_in_sync, make_nodes, print_logs,
                         shard_leaders, spread, until)
from helpers import unavailable
from http_api import call

pytestmark = pytest.mark.timeout(240)

SHARDS = 3
ARGUMENTS = {"x-queue-type": "quorum"}


def leaders(etcd) -> list[str | None]:
    return shard_leaders(etcd, SHARDS)


def everyone_in_sync(etcd, names) -> bool:
    return groups_in_sync(etcd, names, SHARDS)


def hutchctl(node, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.hutchctl", "--url", "http://127.0.0.1:%d" % node.ports["http"],
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})


@pytest.fixture
def three(tmp_path):
    """(etcd, [n1, n2, n3]), each node of three shards, every group in sync."""
    with spread(tmp_path, 3, SHARDS) as etcd_and_nodes:
        yield etcd_and_nodes


def test_every_node_leads_a_shard_and_a_killed_nodes_shards_move_without_losing_a_confirm(three):
    etcd, nodes = three
    by_name = {node.name: node for node in nodes}
    assert sorted(leaders(etcd)) == ["n1", "n2", "n3"]  # balanced from the start

    # one queue per shard (placed balanced), declared through one node
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", nodes[0].port))
    channel = connection.channel()
    for n in range(SHARDS):
        channel.queue_declare("spread-%d" % n, durable=True, arguments=ARGUMENTS)
    connection.close()

    # any node's API (a follower forwards it to shard 0's leader) says who leads what
    def shard_view():
        status = json.loads(hutchctl(nodes[2], "cluster_status", "--formatter", "json").stdout.splitlines()[-1])
        return status if [g["leader"] for g in status.get("shards", ())] == leaders(etcd) and \
            all(len(g["in_sync"]) == 3 for g in status["shards"]) else None

    status = until(shard_view, 30, "cluster_status to show every shard's group")
    assert [g["shard"] for g in status["shards"]] == [0, 1, 2]
    led = {n["name"]: n["leads_shards"] for n in call(nodes[1].ports["http"], "GET", "/api/nodes").body
           if "leads_shards" in n}
    assert sorted(sum(led.values(), [])) == [0, 1, 2] and all(len(shards) == 1 for shards in led.values())
    queues = {q["name"]: q for q in call(nodes[1].ports["http"], "GET", "/api/queues").body}
    assert sorted(queues["spread-%d" % n]["shard"] for n in range(SHARDS)) == [0, 1, 2]
    owners = {name: leaders(etcd)[q["shard"]] for name, q in queues.items()}
    assert all(q["leader"] == "hutch@" + owners[name] for name, q in queues.items())
    text = hutchctl(nodes[0], "cluster_status").stdout
    assert "Shard Leaders" in text and "leads 1 of 3 shards" in text
    leader_of_0 = by_name[leaders(etcd)[0]]
    metrics = call(leader_of_0.ports["prometheus"], "GET", "/metrics").body
    metrics = metrics.decode() if isinstance(metrics, bytes) else metrics
    assert 'hutch_cluster_shard_leader{shard="1",node="%s"} 1' % leaders(etcd)[1] in metrics

    # the UI, through a follower of shard 0's group: the shards each node leads, each queue's leader
    require_chromium()
    ui = Ui(next(n for n in nodes if n.name != leaders(etcd)[0]).ports["http"])
    try:
        ui.login("guest", "guest")
        table = ui.wait(lambda: (lambda r: r if len(r) == 3 else None)(node_rows(ui)), "three nodes in the table")
        # a row names its member "hutch@n2", or "hutch@<host> (n1)" for the node answering
        member = {name: name.split("(")[-1].rstrip(")") if "(" in name else name.split("@")[-1] for name in table}
        assert {member[name]: row["Leads shards"] for name, row in table.items()} == \
            {name: str(shard) for shard, name in enumerate(leaders(etcd))}
        # each shard's group: its leader, its in-sync set, each follower's state and lag
        groups = ui.wait(lambda: (lambda r: r if len(r) == SHARDS else None)(_table(ui, "#shards table")),
                         "the shards' table")
        assert [(row["Shard"], row["Leader"]) for row in groups] == [(str(k), name) for k, name in
                                                                     enumerate(leaders(etcd))]
        assert all(sorted(row["In sync"].split(", ")) == ["n1", "n2", "n3"] and row["Followers"].count("in sync") == 2
                   for row in groups)
        ui.open("queues")
        ui.filter("spread-")
        ui.wait(lambda: len(queue_rows(ui)) == SHARDS, "the three queues listed")
        assert {row["Name"]: row["Leader"] for row in queue_rows(ui)} == \
            {name: "hutch@" + owner for name, owner in owners.items()}
    finally:
        ui.close()

    # across nodes, the cross-shard rules hold: a transaction over the three shards' queues, and
    # dead letters from a queue on one shard to one on another (declared where placement puts them)
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", nodes[2].port))
    channel = connection.channel()
    channel.tx_select()
    for n in range(SHARDS):
        channel.basic_publish("", "spread-%d" % n, b"in a transaction", pika.BasicProperties(delivery_mode=2))
    assert all(channel.queue_declare("spread-%d" % n, passive=True).method.message_count == 0 for n in range(SHARDS))
    channel.tx_commit()
    assert [channel.basic_get("spread-%d" % n, auto_ack=True)[2] for n in range(SHARDS)] == \
        [b"in a transaction"] * SHARDS
    channel = connection.channel()  # not transactional
    channel.queue_declare("spread-dead", durable=True, arguments=ARGUMENTS)
    channel.queue_declare("spread-expiring", durable=True, arguments={
        "x-message-ttl": 0, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "spread-dead"})
    placed = {q["name"]: q["shard"] for q in call(nodes[1].ports["http"], "GET", "/api/queues").body}
    assert placed["spread-dead"] != placed["spread-expiring"]
    channel.basic_publish("", "spread-expiring", b"dead", pika.BasicProperties(delivery_mode=2))
    def dead_letter():
        got = channel.basic_get("spread-dead", auto_ack=True)
        return got if got[0] is not None else None

    got = until(dead_letter, 10, "the dead letter on another shard")
    assert got[2] == b"dead" and got[1].headers["x-death"][0]["reason"] == "expired"
    connection.close()

    # confirmed load on every queue, each through the nodes in another order
    urls = [node.url for node in nodes]
    loads = [Load(urls[n:] + urls[:n], "spread-%d" % n, ARGUMENTS).start() for n in range(SHARDS)]
    for load in loads:
        load.progress(200, 60, "confirms on %s" % load.queue)

    # SIGKILL the node that leads shard 1 (not shard 0: the API's answers come from shard 0's leader)
    victim = by_name[leaders(etcd)[1]]
    assert victim.name != leaders(etcd)[0]
    kept = {shard: name for shard, name in enumerate(leaders(etcd)) if name != victim.name}
    victim.process.kill()
    victim.process.wait(10)
    until(lambda: None not in leaders(etcd) and victim.name not in leaders(etcd), 30, "shard 1's new leader")
    # only the victim's shard moved
    assert all(leaders(etcd)[shard] == name for shard, name in kept.items())
    for load in loads:
        load.progress(200, 60, "confirms on %s after the kill" % load.queue)
    for load in loads:
        lost, _duplicates = load.finish(60)
        assert not lost, "%s: %d confirmed messages lost" % (load.queue, len(lost))

    # the victim comes back as a follower of every group: it leads nothing until asked
    victim.start()
    until(lambda: everyone_in_sync(etcd, ["n1", "n2", "n3"]), 90, "the victim back in sync in every group")
    assert victim.name not in leaders(etcd)
    done = hutchctl(nodes[0] if nodes[0] is not victim else nodes[2], "rebalance")
    assert done.returncode == 0, done.stderr
    assert "leadership handed from" in done.stdout and victim.name in done.stdout
    until(lambda: set(leaders(etcd)) == {"n1", "n2", "n3"}, 30, "every node to lead a shard again")

    # every queue serves through the returned node: a confirmed publish, then a get
    def round_trip() -> bool:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", victim.port))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            for n in range(SHARDS):
                channel.basic_publish("", "spread-%d" % n, b"after", pika.BasicProperties(delivery_mode=2))
            return all(channel.basic_get("spread-%d" % n, auto_ack=True)[2] == b"after" for n in range(SHARDS))
        finally:
            connection.close()

    until(lambda: _quietly(round_trip), 30, "every queue to serve through the returned node")

    # client-local: a queue goes to the shard the node the client reached leads (each connection
    # lands on any of the node's shard processes; a follower forwards it to that shard)
    local = leaders(etcd).index(victim.name)

    def shard_of_new_queue(name: str) -> int:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", victim.port))
        try:
            connection.channel().queue_declare(name, durable=True,
                                               arguments={**ARGUMENTS, "x-queue-leader-locator": "client-local"})
        finally:
            connection.close()
        return call(victim.ports["http"], "GET", "/api/queues/%2F/" + name).body["shard"]

    # (each of its followers learns within a second that the node leads a shard again; the kernel
    # hands each connection to any of the node's shard processes)
    attempts = iter(range(1000))
    until(lambda: [shard_of_new_queue("local-%d" % next(attempts)) for _ in range(6)] == [local] * 6, 30,
          "client-local queues on %s's shard" % victim.name)
    # a planned hand-over gives nobody changes to set aside: only the killed leader had some (its last
    # unconfirmed writes to shard 1), none of the nodes that followed the rebalance's new leaders
    for node in nodes:
        aside = sorted(str(p.relative_to(node.data_dir.parent)) for p in node.data_dir.parent.glob(node.name + "*/**/")
                       if ".set-aside-" in p.name)
        assert all(path.startswith("%s/shards/1.set-aside-" % victim.name) for path in aside), aside


def _table(ui, css: str) -> list[dict]:
    """The rows of the table at `css` as {column heading: cell text}."""
    return ui.driver.execute_script("""
        const table = document.querySelector(arguments[0]);
        if (!table) return [];
        const heads = Array.from(table.querySelectorAll('thead th'), th => th.innerText.trim());
        return Array.from(table.querySelectorAll('tbody tr'), row =>
          Object.fromEntries(heads.map((h, i) => [h, row.cells[i] ? row.cells[i].innerText.trim() : ''])));""", css)


def node_rows(ui) -> dict:
    return {row["Name"]: row for row in _table(ui, "#nodes table")}


def queue_rows(ui) -> list[dict]:
    return [row for row in _table(ui, "#queues table") if "Leader" in row]


def _quietly(attempt) -> bool:
    try:
        return attempt()
    except pika.exceptions.AMQPError:
        return False


def test_a_node_of_several_shards_becomes_a_cluster_with_every_message_it_held(tmp_path):
    """Turning a node into a cluster keeps its data, shard by shard: it founds every group."""
    etcd = EtcdProcess(tmp_path)
    nodes = make_nodes(tmp_path, etcd.url, 3, "--shards", str(SHARDS))
    first = nodes[0]
    for node in nodes:
        node.ports["replication"] = free_port_run(SHARDS)
    etcd.start()
    try:
        first.start_alone("--shards", str(SHARDS))
        until(lambda: first.log.count("listening for AMQP") >= SHARDS, 30, "every shard listening")
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", first.port))
        channel = connection.channel()
        channel.confirm_delivery()
        for n in range(6):
            channel.queue_declare("kept-%d" % n, durable=True)
            for i in range(20):
                channel.basic_publish("", "kept-%d" % n, b"%d" % i, pika.BasicProperties(delivery_mode=2))
        connection.close()
        held = {q["name"]: q["shard"] for q in call(first.ports["http"], "GET", "/api/queues").body}
        assert sorted(set(held.values())) == [0, 1, 2]  # every shard holds some
        first.stop()
        for node in nodes:
            node.start()
        until(lambda: groups_in_sync(etcd, ["n1", "n2", "n3"], SHARDS), 90, "every group in sync")
        assert leaders(etcd) == ["n1"] * SHARDS  # the node with the data founded every group
        done = hutchctl(first, "rebalance")
        assert done.returncode == 0, done.stderr
        until(lambda: set(leaders(etcd)) == {"n1", "n2", "n3"}, 30, "the leaders spread")

        def counts():
            connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", nodes[2].port))
            try:
                channel = connection.channel()
                return [channel.queue_declare("kept-%d" % n, passive=True).method.message_count for n in range(6)]
            finally:
                connection.close()

        until(lambda: _quietly(lambda: counts() == [20] * 6), 30, "every message, through another node")
    finally:
        for node in nodes:
            node.stop()
        etcd.stop()
        print_logs(nodes)


def test_a_node_of_another_shard_count_is_refused(tmp_path):
    etcd = EtcdProcess(tmp_path)
    first, second = make_nodes(tmp_path, etcd.url, 2, "--shards", "2")
    second.extra = ("--shards", "3")
    first.ports["replication"] = free_port_run(2)
    second.ports["replication"] = free_port_run(3)
    etcd.start()
    try:
        first.start()
        until(lambda: etcd_get(etcd.url, "hutch/shards/count") == b"2", 60, "n1 to record its shard count")
        second.start()
        assert second.process.wait(60) == 1
        assert "this node runs 3 shards and cluster nodes under etcd prefix 'hutch' run 2: every node of a " \
               "cluster runs the same number of shards (set shards: 2)" in second.log
    finally:
        for node in (first, second):
            node.stop()
        etcd.stop()
        print_logs([first, second])


def test_an_isolated_node_gives_up_only_its_shards_and_nothing_confirmed_is_lost(tmp_path):
    """Real namespaces (tests/spread_faults.py): three etcd members, three nodes of three shards and
    the clients, each in its own; the node that leads shard 1 is cut from everything under
    confirmed load on every shard's queue, then healed. The other faults (a leader cut from the
    other nodes only, a leader on etcd's minority side) run in bench/partitions_spread.py."""
    import spread_faults

    why = spread_faults.missing()
    if why is not None:
        unavailable(why)
    report = spread_faults.run(tmp_path, ["isolated"])
    if report["problems"]:
        for name, log in report["logs"].items():
            print("===== %s\n%s" % (name, log[-20000:]))
    assert not report["problems"], report["problems"]
    (isolated,) = report["faults"]
    # shard 1 moved, the shards the victim did not lead stayed where they were, and every queue
    # went on confirming meanwhile (each load reconnects to another node when its own was cut)
    assert isolated["moved"] == [1] and all(n > 0 for n in isolated["during"]), isolated
    # the other shards' leaders found their links to the cut one dead by its missing heartbeats
    # (a cut closes no TCP connection they could see)
    others = [name for name in ("n1", "n2", "n3") if name != isolated["victim"]]
    assert any("nothing from shard 1 for" in report["logs"][name] for name in others), \
        "no link taken for lost by its heartbeats"
    assert all(q["confirmed"] > 150 for q in report["queues"]), report["queues"]


def test_a_shard_leader_past_its_lease_hands_nothing_to_consumers_on_other_nodes(tmp_path):
    """Issue 39, in real namespaces (tests/spread_faults.py `links_past_the_lease`): the leader of
    shard 0 and an etcd member cut from etcd's majority, not from the other nodes or the clients,
    while a publisher sends into a queue of shard 0 through it and a consumer on another node gets
    that queue's messages over the links. Past its lease's deadline the cut-off leader hands that
    consumer nothing (as it writes nothing to its own clients), until shard 0 is led elsewhere and
    the consumer is cancelled: never two leaders' deliveries at once."""
    import spread_faults

    why = spread_faults.missing()
    if why is not None:
        unavailable(why)
    report = spread_faults.links_past_the_lease(tmp_path)
    logs = report.pop("logs", {})
    print(report)
    if report["problems"]:
        for name, log in logs.items():
            print("===== %s\n%s" % (name, log[-20000:]))
    assert not report["problems"], report["problems"]
    # shard 0 moved, and the consumer's shard found the struck leader's link silent (it closed nothing)
    assert report["new_leader"] not in (None, report["victim"]), report
    assert "nothing from shard 0 for" in logs[report["consumer_on"]], "the link was not taken for lost"


def test_force_boot_marks_every_shards_group(tmp_path):
    """`hutchctl force_boot --data-dir DIR` on a node of several shards: each shard's group is a
    cluster of its own, so each of their directories gets the operator's word."""
    data = tmp_path / "data"
    for directory in (data, data / "shards" / "1", data / "shards" / "2"):
        directory.mkdir(parents=True)
        (directory / "cluster_state").write_text("{}")
    (data / "shards" / "3").mkdir()  # no cluster state: not a group this node has joined
    done = subprocess.run([sys.executable, "-m", "cli.hutchctl", "force_boot", "--data-dir", str(data)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    marked = sorted(str(p.parent.relative_to(data)) for p in data.rglob("force_boot"))
    assert marked == [".", "shards/1", "shards/2"]


def _refusal(port: int) -> str | None:
    """The broker's refusal of a new connection to `port` (None: admitted, and closed)."""
    try:
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)).close()
    except pika.exceptions.AMQPConnectionError as exc:
        return str(exc)
    return None


def _served_by(port: int, shard: int, keep: bool = False) -> pika.BlockingConnection | bool:
    """Whether the shard serving a new connection to `port` is `shard`; with
    `keep`, that connection (else None), open."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    served = connection._impl.server_properties["shard"] == shard
    if keep and served:
        return connection
    connection.close()
    return None if keep else served


def test_connection_max_counts_the_connections_of_this_node_only(tmp_path):
    """connection_max is a node's (RabbitMQ's): in a cluster whose shard leaders
    link every node, a node at its limit refuses the next connection while
    another node, holding none, admits it."""
    with spread(tmp_path, 2, 2, "--connection-max", "2") as (etcd, nodes):
        led = {name: shard for shard, name in enumerate(shard_leaders(etcd, 2))}
        first, second = nodes
        # a follower forwards its clients to a leader of its own node once it has seen which (the
        # kernel hands a connection to any of the node's shard processes: several in a row tell)
        for node in nodes:
            until(lambda: all(_served_by(node.port, led[node.name]) for _ in range(8)), 30,
                  "the clients of %s served there" % node.name)
        held: list = []
        try:
            for _ in range(2):
                held.append(until(lambda: _served_by(first.port, led[first.name], keep=True), 30, "a client served by n1"))
            assert "(530) 'NOT_ALLOWED - connection refused: node connection limit (2) is reached'" in \
                _refusal(first.port)
            assert _served_by(second.port, led[second.name])  # admitted there: n2 holds no connection
        finally:
            for connection in held:
                connection.close()


def test_transient_definitions_of_a_live_shard_survive_group_0s_failover(tmp_path):
    """Group 0's leader orders every definition, and its new leader after a
    failover knows the durable ones only (they are replicated): a transient
    queue, exchange and binding that shard 1 holds, on a node that lives on,
    are still there for every shard, with their messages."""
    with spread(tmp_path, 2, 2) as (etcd, nodes):
        led = {name: shard for shard, name in enumerate(shard_leaders(etcd, 2))}
        survivor = next(node for node in nodes if led[node.name] == 1)
        victim = next(node for node in nodes if led[node.name] == 0)
        # held by shard 1's process itself: a follower ends what it forwards when its group changes leader
        holder = _held_by(survivor, 1)
        channel = holder.channel()
        channel.exchange_declare("gone-with-0?", "fanout", durable=False)
        channel.queue_declare("transient-on-1", durable=False, arguments={"x-queue-master-locator": "client-local"})
        channel.queue_bind("transient-on-1", "gone-with-0?")
        exclusive = channel.queue_declare("", exclusive=True).method.queue
        channel.confirm_delivery()
        for n in range(3):
            channel.basic_publish("gone-with-0?", "", b"m%d" % n)

        victim.process.kill()
        victim.process.wait(10)
        until(lambda: shard_leaders(etcd, 2)[0] == survivor.name, 60, "group 0 led by the survivor")
        # a client of shard 0 (the new leader of group 0) sees them, and routes through them
        other = until(lambda: _served_by(survivor.port, 0, keep=True), 60, "a client served by shard 0")
        try:
            until(lambda: _count(other, "transient-on-1") == 3, 30, "the transient queue's messages seen by shard 0")
            publisher = other.channel()
            publisher.confirm_delivery()
            publisher.basic_publish("gone-with-0?", "", b"after")
            until(lambda: _count(other, "transient-on-1") == 4, 30, "routed through the transient exchange")
            assert _count(holder, exclusive) == 0  # its connection lives: so does it
        finally:
            other.close()
            holder.close()


def _held_by(node, shard: int) -> pika.BlockingConnection:
    """A connection to `node` whose socket its process of `shard` holds (not one forwarded to it
    by another of the node's shard processes): that process listens on the group's replication port."""
    process = _pids("-tlnp", "sport", "=", ":%d" % (node.ports["replication"] + shard))
    for _ in range(40):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
        port = connection._impl._transport._sock.getsockname()[1]
        holder = _pids("-tnp", "state", "established", "sport", "=", ":%d" % node.port, "dport", "=", ":%d" % port)
        if holder and holder <= process:
            return connection
        connection.close()
    raise AssertionError("no connection to %s held by its shard %d" % (node.name, shard))


def _pids(*ss: str) -> set[int]:
    """The processes holding the sockets `ss` lists."""
    listed = subprocess.run(["ss", "-H", *ss], capture_output=True, text=True, timeout=10).stdout
    return {int(pid) for pid in re.findall(r"pid=(\d+)", listed)}


def _count(connection, queue: str) -> int | None:
    """The message count of a passive declare on a new channel of `connection`; None for a 404."""
    channel = connection.channel()
    try:
        count = channel.queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return None
    channel.close()
    return count
