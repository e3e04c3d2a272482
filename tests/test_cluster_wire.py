"""The replication port and its connections, on real etcd and real hutch
nodes (tests/cluster_kit.py), with a raw peer written from the docs
(tests/replication_raw.py): only running members holding the cluster secret
replicate; hostile input costs nothing; heartbeats bring a cut-off follower
back after a partition heals, and a follower refuses a leader of a lower
term; the leader's memory towards a slow or joining follower is bounded; a
client of a follower keeps its address at the leader."""
from __future__ import annotations

import json
import os
import socket
import threading
import time

import pika
import pytest

from amqp_raw import PROTOCOL_HEADER, RawClient
from cluster_kit import (SECRET, EtcdProcess, etcd_get, etcd_put, free_ports, in_sync, make_nodes, port_open,
                         print_logs, running, seed, started, until)
from http_api import call
from replication_raw import (HEAD, HEARTBEAT, HELLO, LISTING, REFUSED, SNAPSHOT_END, WELCOME, WRITE, Peer, file_frame,
                             frame, serve_handshake)

pytestmark = pytest.mark.timeout(240)

MiB = 1 << 20
MARK = b"a-body-only-members-may-read"


def publish(url: str, queue: str, body: bytes, count: int = 1) -> None:
    """`count` confirmed persistent messages."""
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        for _ in range(count):
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))


def register(etcd: EtcdProcess, name: str) -> None:
    """A member the test plays: its nodes/ key, as a running node has."""
    etcd_put(etcd.url, "hutch/nodes/" + name, json.dumps({"advertise": "127.0.0.1", "replication_port": 1,
                                                           "role": "follower", "ports": {}}).encode())


def snapshot(peer: Peer) -> None:
    """As a member with nothing: LISTING, then read until SNAPSHOT_END."""
    peer.send(frame(LISTING, {"files": {}}))
    while True:
        got = peer.read_frame()
        assert got is not None, "the leader closed before the snapshot's end"
        if got[0] == SNAPSHOT_END:
            return


def beating(peer: Peer, stop: threading.Event) -> threading.Thread:
    """A thread sending the peer's heartbeats until `stop` (its reads are the test's)."""
    def beat():
        while not stop.wait(0.3):
            try:
                peer.send(frame(HEARTBEAT, {}))
            except OSError:
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    return thread


def test_only_running_members_holding_the_secret_replicate(tmp_path):
    # client listeners on 127.0.0.2, the advertised address (the replication port's) 127.0.0.1
    with running(tmp_path, 1, "--bind", "127.0.0.2") as (etcd, (n1,)):
        publish("amqp://guest:guest@127.0.0.2:%d/" % n1.port, "kept", MARK)
        port = n1.ports["replication"]
        assert port_open(port)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", port), timeout=5).close()

        # the protocol of old (HELLO with a listing, no proof): nothing of value comes back
        stranger = Peer(port)
        stranger.send(frame(HELLO, {"name": "n9", "files": {}}))
        assert stranger.closed_within(30)
        assert MARK not in stranger.received and stranger.file_bytes() == 0

        # a registered name without the secret is refused, and told why
        impostor = Peer(port)
        kind, answer = impostor.hello("not-the-cluster-secret", "n1")
        assert kind == REFUSED and "does not hold this cluster's secret" in answer["reason"]
        assert impostor.closed_within(30) and impostor.file_bytes() == 0

        # the secret without a running member's name is refused too
        outsider = Peer(port)
        kind, answer = outsider.hello(SECRET, "n9")
        assert kind == REFUSED and "not a running member" in answer["reason"]
        assert outsider.closed_within(30) and outsider.file_bytes() == 0

        # a registered member with the secret gets the snapshot (the raw peer speaks the protocol)
        register(etcd, "n9")
        member = Peer(port)
        kind, answer = member.hello(SECRET, "n9")
        assert kind == WELCOME and answer["term"] > 0
        snapshot(member)
        assert MARK in member.received
        member.close()

        # a node started with another secret never joins, and says why
        n2 = make_nodes(tmp_path / "other", etcd.url, 2)[1]
        n2.secret = "a-different-secret-altogether"
        try:
            n2.start()
            until(lambda: "does not hold this cluster's secret" in n2.log, 30, "n2 to be refused")
            assert in_sync(etcd) == ["n1"]
        finally:
            n2.stop()
            print_logs([n2])


def test_the_replication_port_survives_hostile_input(tmp_path):
    with running(tmp_path, 1) as (etcd, (n1,)):
        port = n1.ports["replication"]
        half_open = [Peer(port) for _ in range(3)]  # connect, then say nothing
        garbage = Peer(port)
        garbage.send(os.urandom(4096))
        huge = Peer(port)
        huge.send(HEAD.pack(0xFFFFFFFF, HELLO))
        truncated = Peer(port)
        truncated.send(HEAD.pack(100, HELLO) + b"{")
        not_json = Peer(port)
        not_json.send(HEAD.pack(3, HELLO) + b"\xff\xfe\xfd")
        for peer in [*half_open, garbage, huge, truncated, not_json]:
            assert peer.closed_within(30), "the leader kept a hostile connection open"
            assert peer.file_bytes() == 0
        until(lambda: "did not complete the handshake" in n1.log, 10, "the leader to log the silent ones")
        # a flood of silent connections from one address locks out no member at another
        flood = [Peer(port) for _ in range(80)]
        assert any(peer.closed_within(5) for peer in flood[64:]), "no limit per address"
        register(etcd, "n9")
        member = Peer(port, source="127.0.0.2")
        assert member.hello(SECRET, "n9")[0] == WELCOME
        member.close()
        for peer in flood:
            peer.close()
        # it still serves, and a real follower joins
        publish(n1.url, "after", b"m")
        n2 = make_nodes(tmp_path / "other", etcd.url, 2)[1]
        try:
            n2.start()
            until(lambda: in_sync(etcd) == ["n1", "n2"], 60, "a real follower to join")
        finally:
            n2.stop()
            print_logs([n2])
        assert "Traceback" not in n1.log


class Relay:
    """A TCP relay in front of `target`. `cut()` turns it into a black hole
    (nothing passes, nothing closes: a partition); after `heal()` new
    connections pass, and those of before stay dead, as connections whose
    other end gave up on them (TCP timed out) while the path was cut."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.is_cut = False
        self.connections: list[dict] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            connection = {"dead": self.is_cut, "sockets": [client]}
            self.connections.append(connection)
            if not connection["dead"]:
                try:
                    upstream = socket.create_connection(("127.0.0.1", self.target))
                except OSError:
                    client.close()
                    continue
                connection["sockets"].append(upstream)
                threading.Thread(target=self._pump, args=(upstream, client, connection), daemon=True).start()
                threading.Thread(target=self._pump, args=(client, upstream, connection), daemon=True).start()
            else:
                threading.Thread(target=self._pump, args=(client, None, connection), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket | None, connection: dict) -> None:
        while True:
            try:
                data = source.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            if not connection["dead"]:
                try:
                    target.sendall(data)
                except OSError:
                    break
        if not connection["dead"]:  # a close passes too, unless the path is cut
            for sock in connection["sockets"]:
                sock.close()

    def cut(self) -> None:
        self.is_cut = True
        for connection in self.connections:
            connection["dead"] = True

    def heal(self) -> None:
        self.is_cut = False

    def close(self) -> None:
        self.listener.close()
        for connection in self.connections:
            for sock in connection["sockets"]:
                sock.close()


def leading_behind(etcd: EtcdProcess, n1, port: int) -> None:
    """Once n1 leads and has registered its listeners: its nodes/ key says
    its replication port is `port` (a relay, a fake leader)."""
    until(lambda: "amqp" in json.loads(etcd_get(etcd.url, "hutch/nodes/n1") or b"{}").get("ports", {}), 60,
          "n1 to lead and register its listeners")
    info = json.loads(etcd_get(etcd.url, "hutch/nodes/n1"))
    info["replication_port"] = port
    etcd_put(etcd.url, "hutch/nodes/n1", json.dumps(info).encode(), lease_of="hutch/nodes/n1")


def test_a_follower_cut_off_is_dropped_and_back_in_sync_once_the_partition_heals(tmp_path):
    etcd = EtcdProcess(tmp_path).start()
    n1, n2 = nodes = make_nodes(tmp_path, etcd.url, 2, "--cluster-replication-timeout", "2")
    relay = Relay(n1.ports["replication"])
    try:
        seed(n1)
        n1.start()
        leading_behind(etcd, n1, relay.port)
        n2.start()
        until(lambda: in_sync(etcd) == ["n1", "n2"], 60, "n2 in sync through the relay")
        relay.cut()  # nothing flows, nobody is told
        until(lambda: in_sync(etcd) == ["n1"], 30, "the leader to drop the silent follower")
        until(lambda: "nothing heard from it" in n1.log, 10, "the leader to say why")
        relay.heal()  # the old connection stays dead: only a new one helps
        until(lambda: in_sync(etcd) == ["n1", "n2"], 60, "n2 back in sync without a restart")
        until(lambda: "nothing from the leader" in n2.log, 10, "the follower to say why")
        assert "rejoining" not in n2.log  # no re-execution either
        publish(n1.url, "after-the-partition", b"m")  # a confirm that waits for n2 again
    finally:
        for node in nodes:
            node.stop()
        relay.close()
        etcd.stop()
        print_logs(nodes)


def test_a_follower_refuses_a_leader_of_a_lower_term(tmp_path):
    etcd = EtcdProcess(tmp_path).start()
    n1, n2 = nodes = make_nodes(tmp_path, etcd.url, 2, "--cluster-replication-timeout", "2")
    relay = Relay(n1.ports["replication"])
    fake = socket.create_server(("127.0.0.1", 0))
    dialled = []
    try:
        seed(n1)
        n1.start()
        leading_behind(etcd, n1, relay.port)
        n2.start()
        until(lambda: in_sync(etcd) == ["n1", "n2"], 60, "n2 in sync")
        register(etcd, "probe")
        probe = Peer(n1.ports["replication"])
        kind, answer = probe.hello(SECRET, "probe")
        assert kind == WELCOME
        term = answer["term"]
        probe.close()

        def stale_leader():
            # holds the secret, but leads an older term: it would plant a file
            while True:
                try:
                    conn, _ = fake.accept()
                except OSError:
                    return
                dialled.append(conn)
                try:
                    served = serve_handshake(conn, SECRET, term - 1)
                    if served is not None and served[0].read_frame() is not None:  # LISTING: it went on
                        conn.sendall(file_frame(WRITE, "planted", 0, b"stale") +
                                     frame(SNAPSHOT_END, {"position": 0, "term": term - 1}))
                except OSError:
                    pass

        threading.Thread(target=stale_leader, daemon=True).start()
        leading_behind(etcd, n1, fake.getsockname()[1])
        relay.close()  # n2's connection ends: it finds the leader's address again
        until(lambda: len(dialled) >= 2, 60, "n2 to dial the stale leader (and again)")
        until(lambda: "older than term %d" % term in n2.log, 30, "n2 to refuse the stale term")
        assert not (n2.data_dir / "planted").exists()
        leading_behind(etcd, n1, n1.ports["replication"])
        until(lambda: in_sync(etcd) == ["n1", "n2"], 60, "n2 back with the real leader")
    finally:
        for node in nodes:
            node.stop()
        fake.close()
        relay.close()
        etcd.stop()
        print_logs(nodes)


def rss(node) -> int:
    with open("/proc/%d/status" % node.process.pid) as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def peak_rss_until(node, predicate, timeout: float, what: str) -> int:
    """The node's highest resident size, sampled until `predicate()`."""
    peak = 0

    def sampled():
        nonlocal peak
        peak = max(peak, rss(node))
        return predicate()

    until(sampled, timeout, what)
    return peak


def test_memory_towards_a_slow_or_joining_follower_is_bounded(tmp_path):
    with running(tmp_path, 1, "--cluster-max-lag-bytes", str(16 * MiB), "--cluster-replication-timeout", "2") as (
            etcd, (n1,)):
        port = n1.ports["replication"]
        for name in ("stuck", "slow"):
            register(etcd, name)
        # a member that stops reading once synced: dropped when 16 MiB wait for it, not buffered on
        stuck, stop = Peer(port), threading.Event()
        assert stuck.hello(SECRET, "stuck")[0] == WELCOME
        snapshot(stuck)
        beating(stuck, stop)  # alive, only not reading
        publish(n1.url, "big", os.urandom(MiB), 300)  # ~300 MiB on the leader's disk
        until(lambda: "bytes waiting to be sent to it" in n1.log, 60, "the leader to drop the member not reading")
        stop.set()
        stuck.close()

        # a member that reads the snapshot slowly: the snapshot waits for it
        base = rss(n1)
        slow, stop = Peer(port), threading.Event()
        assert slow.hello(SECRET, "slow")[0] == WELCOME
        beating(slow, stop)
        slow.send(frame(LISTING, {"files": {}}))
        peak, read, started = base, 0, time.monotonic()
        while time.monotonic() - started < 8:
            read += len(slow.sock.recv(64 * 1024))
            peak = max(peak, rss(n1))
            time.sleep(0.02)
        stop.set()
        slow.close()
        assert read > MiB, "the slow member got nothing"
        assert peak - base < 64 * MiB, "the leader grew by %d MiB towards a slow follower" % ((peak - base) // MiB)

        # a real follower joining: bounded too, and in sync at the end
        n2 = make_nodes(tmp_path / "other", etcd.url, 2)[1]
        try:
            base = rss(n1)
            n2.start()
            peak = peak_rss_until(n1, lambda: in_sync(etcd) == ["n1", "n2"], 180, "n2 to join")
            assert peak - base < 128 * MiB, "the leader grew by %d MiB as n2 joined" % ((peak - base) // MiB)
        finally:
            n2.stop()
            print_logs([n2])


def test_a_client_of_a_follower_keeps_its_address_at_the_leader(tmp_path):
    with running(tmp_path, 2) as (etcd, nodes):
        leader = next(n for n in nodes if etcd_get(etcd.url, "hutch/leader") == n.name.encode())
        (follower,) = [n for n in nodes if n is not leader]
        until(lambda: json.loads(etcd_get(etcd.url, "hutch/nodes/%s" % leader.name)).get("ports"), 30,
              "the leader to register its listeners")
        client = RawClient(follower.port, timeout=30)
        try:
            client.handshake("guest", "guest")  # a loopback user, through the follower
            port = client.sock.getsockname()[1]

            def listed():
                mine = [c for c in call(leader.ports["http"], "GET", "/api/connections").body if c["peer_port"] == port]
                return mine or None

            (connection,) = until(listed, 30, "the connection listed under the client's own address")
            assert connection["peer_host"] == "127.0.0.1" and connection["port"] == leader.port
        finally:
            client.sock.close()
        # a PROXY header sent straight to a client listener claims nothing: it is not AMQP
        with socket.create_connection(("127.0.0.1", leader.port), timeout=10) as raw:
            raw.sendall(b"PROXY TCP4 10.9.8.7 127.0.0.1 5555 5672\r\n" + PROTOCOL_HEADER)
            assert raw.recv(8) == PROTOCOL_HEADER  # the broker's answer to a bad protocol header
        assert not [c for c in call(leader.ports["http"], "GET", "/api/connections").body
                    if c["peer_host"] == "10.9.8.7"]


def cluster_pki(directory) -> dict:
    """A CA, one certificate of it for the members, one of another CA."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from test_tls import _issue, _name, _write

    new_key = lambda: ec.generate_private_key(ec.SECP256R1())  # noqa: E731
    ca_key, rogue_ca_key, member_key, rogue_key = new_key(), new_key(), new_key(), new_key()
    ca = _issue("hutch cluster CA", ca_key, _name("hutch cluster CA"), ca_key, ca=True)
    rogue_ca = _issue("another CA", rogue_ca_key, _name("another CA"), rogue_ca_key, ca=True)
    return {"ca": _write(directory, "ca", ca, ca_key)[0],
            "member": _write(directory, "member", _issue("member", member_key, ca.subject, ca_key), member_key),
            "rogue": _write(directory, "rogue", _issue("member", rogue_key, rogue_ca.subject, rogue_ca_key),
                            rogue_key)}


def test_the_replication_stream_in_mutual_tls(tmp_path):
    import ssl

    pki = cluster_pki(tmp_path)
    flags = ("--cluster-tls-certfile", pki["member"][0], "--cluster-tls-keyfile", pki["member"][1],
             "--cluster-tls-cacertfile", pki["ca"])
    with running(tmp_path, 2, *flags) as (etcd, nodes):  # in sync over TLS
        leader = next(n for n in nodes if etcd_get(etcd.url, "hutch/leader") == n.name.encode())
        publish(leader.url, "kept", MARK)  # confirmed: the follower has it
        port = leader.ports["replication"]
        register(etcd, "probe")

        def member_over(cert: tuple[str, str] | None) -> Peer:
            peer = Peer(port)
            assert peer.hello(SECRET, "probe")[0] == WELCOME
            if cert is None:
                return peer
            context = ssl.create_default_context(cafile=pki["ca"])
            context.check_hostname = False
            context.load_cert_chain(*cert)
            return Peer(0, sock=context.wrap_socket(peer.sock))

        # the secret without TLS: the stream never starts in clear text
        plain = member_over(None)
        plain.send(frame(LISTING, {"files": {}}))
        assert plain.closed_within(30) and MARK not in plain.received and plain.file_bytes() == 0
        # TLS with a certificate of another CA: refused
        try:
            rogue = member_over(pki["rogue"])
            rogue.send(frame(LISTING, {"files": {}}))  # TLS 1.3: the client's certificate is judged after this
            assert rogue.read_frame() is None
        except (ssl.SSLError, OSError):
            pass  # refused in the TLS handshake or at the first read
        until(lambda: "certificate verify failed" in leader.log, 30, "the leader to say why it refused")
        # a member's certificate: the snapshot, inside TLS
        member = member_over(pki["member"])
        snapshot(member)
        assert MARK in member.received
        member.close()


def test_a_forwarded_connection_is_served_under_the_address_its_member_names(tmp_path):
    """What a follower's forwarding tells the leader (the client's address,
    inside the handshake's proof) is what the leader's checks use: loopback
    users, the login log, connection listings. Only a member may say it."""
    from pamqp import commands

    with running(tmp_path, 1) as (etcd, (n1,)):
        register(etcd, "n9")
        http = n1.ports["http"]
        assert call(http, "PUT", "/api/users/remote", {"password": "pw", "tags": ""}).status in (201, 204)
        assert call(http, "PUT", "/api/permissions/%2F/remote",
                    {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)

        def forwarded(secret: str = SECRET) -> tuple[int, RawClient]:
            client = RawClient(n1.ports["replication"], timeout=10)
            kind, _answer = Peer(0, sock=client.sock).hello(secret, "n9", "forward", "amqp", ["10.1.2.3", 4444])
            return kind, client

        kind, stranger = forwarded("not-the-cluster-secret")
        assert kind == REFUSED
        stranger.sock.close()

        kind, guest = forwarded()
        assert kind == WELCOME
        guest.handshake_start()
        guest.login("guest", "guest")  # a loopback user, from 10.1.2.3: refused
        assert guest.expect(commands.Connection.Close, 0).reply_code == 403
        guest.sock.close()
        until(lambda: "login refused for user 'guest' from ('10.1.2.3', 4444)" in n1.log, 10, "the refusal logged")

        kind, remote = forwarded()
        assert kind == WELCOME
        remote.handshake("remote", "pw")
        listed = until(lambda: [c for c in call(http, "GET", "/api/connections").body if c["user"] == "remote"], 30,
                       "the forwarded connection listed")
        assert (listed[0]["peer_host"], listed[0]["peer_port"]) == ("10.1.2.3", 4444)
        assert listed[0]["port"] == n1.port  # the AMQP listener's, not the replication port
        remote.sock.close()


def test_amqps_through_a_follower_is_served_by_the_leader_under_the_clients_address(tmp_path):
    """TLS passes through the follower and the replication port: the
    leader terminates it with its AMQPS listener's certificate."""
    import ssl

    pki = cluster_pki(tmp_path)
    etcd = EtcdProcess(tmp_path).start()
    nodes = make_nodes(tmp_path, etcd.url, 2)
    for node in nodes:  # each its own AMQPS port
        node.extra = ("--tls-certfile", pki["member"][0], "--tls-keyfile", pki["member"][1],
                      "--tls-port", str(free_ports(1)[0]))
    try:
        seed(nodes[0])
        with started(etcd, nodes):
            leader = next(n for n in nodes if etcd_get(etcd.url, "hutch/leader") == n.name.encode())
            (follower,) = [n for n in nodes if n is not leader]
            until(leader.leads, 30, "the leader to register its listeners")
            context = ssl.create_default_context(cafile=pki["ca"])
            context.check_hostname = False
            params = pika.ConnectionParameters("127.0.0.1", int(follower.extra[-1]),
                                               credentials=pika.PlainCredentials("guest", "guest"),
                                               ssl_options=pika.SSLOptions(context))
            with pika.BlockingConnection(params) as connection:
                port = connection._impl._transport._sock.getsockname()[1]  # pika keeps its socket private
                connection.channel().queue_declare("over-tls", durable=True)
                (listed,) = until(lambda: [c for c in call(leader.ports["http"], "GET", "/api/connections").body
                                           if c["peer_port"] == port] or None, 30, "the connection listed")
                assert listed["ssl"] is True and listed["peer_host"] == "127.0.0.1"
                assert listed["port"] == int(leader.extra[-1])
    finally:
        print_logs(nodes)
