"""The stream protocol's edges over a raw socket (tests/stream_raw.py):
SASL mechanisms and failures, vhost access, permissions, the response codes
of requests no client library sends wrong, the commands rstream does not
use (resolve offset spec, stream stats, exchange command versions, Deliver
version 2, super stream creation errors), and a fuzz of mutated sessions:
the broker answers with the protocol's codes and keeps serving."""
from __future__ import annotations

import gzip
import random
import socket
import struct

import pytest

from conftest import ALL_PERMISSIONS, launch
from helpers import unique, wait_for
from http_api import call, segment
from stream_raw import StreamRaw, frame, string, string_map

OK, STREAM_DOES_NOT_EXIST, SUBSCRIPTION_ID_DOES_NOT_EXIST = 1, 2, 4
SASL_MECHANISM_NOT_SUPPORTED, AUTHENTICATION_FAILURE, SASL_ERROR = 7, 8, 9
VHOST_ACCESS_FAILURE, UNKNOWN_FRAME, FRAME_TOO_LARGE, ACCESS_REFUSED = 12, 13, 14, 16
PUBLISHER_DOES_NOT_EXIST = 18


@pytest.fixture(scope="module")
def hutch(tmp_path_factory):
    # A short failed-login delay: the refused logins below need not wait.
    broker = launch(tmp_path_factory.mktemp("stream-edges"), "--auth-failure-delay", "0.01",
                    expect=("AMQP", "STREAM", "HTTP", "PROMETHEUS"))
    yield broker
    broker.stop()


@pytest.fixture
def port(hutch) -> int:
    return hutch.ports["STREAM"]


@pytest.fixture
def http(hutch):
    from http_api import Api
    return Api(hutch.ports["HTTP"])


def opened(port: int, vhost: str = "/") -> StreamRaw:
    client = StreamRaw(port)
    assert client.open(vhost) == OK
    return client


def create(client: StreamRaw, stream: str, arguments: dict | None = None) -> int:
    client.request(0x0D, string(stream), string_map(arguments or {}))
    return client.response_code(0x0D)


def publish(client: StreamRaw, stream: str, bodies: list[bytes], publisher_id: int = 7) -> None:
    """Declare a publisher, publish `bodies` as data sections, wait for the confirms."""
    client.request(0x01, struct.pack(">B", publisher_id), string(""), string(stream))
    assert client.response_code(0x01) == OK
    entries = b"".join(struct.pack(">Q", i + 1) + struct.pack(">i", len(amqp(b))) + amqp(b)
                       for i, b in enumerate(bodies))
    client.send(frame(0x02, struct.pack(">Bi", publisher_id, len(bodies)), entries))
    confirmed = 0
    while confirmed < len(bodies):
        rest = client.read_key(0x03)
        confirmed += struct.unpack_from(">i", rest, 1)[0]


def amqp(body: bytes) -> bytes:
    """An AMQP 1.0 message of one data section."""
    return b"\x00\x53\x75\xa0" + bytes((len(body),)) + body


# -- the handshake ---------------------------------------------------------------

def test_sasl_mechanisms_and_failures(port):
    with StreamRaw(port) as client:
        client.request(0x12)
        rest = client.read_key(0x8012)
        assert rest[4:6] == b"\x00\x01" and b"PLAIN" in rest and b"AMQPLAIN" in rest
        assert b"EXTERNAL" not in rest  # no client certificate on a plain socket
    with StreamRaw(port) as client:
        assert client.authenticate(mechanism="SCRAM-SHA-256") == SASL_MECHANISM_NOT_SUPPORTED
    with StreamRaw(port) as client:
        assert client.authenticate(opaque=b"no separators") == SASL_ERROR
    with StreamRaw(port) as client:
        assert client.authenticate("guest", "wrong") == AUTHENTICATION_FAILURE
        assert client.closed()
    with StreamRaw(port) as client:
        assert client.authenticate("nobody", "guest") == AUTHENTICATION_FAILURE
    # AMQPLAIN: an AMQP 0-9-1 field table without its length.
    table = b"".join(bytes((len(k),)) + k + b"S" + struct.pack(">I", len(v)) + v
                     for k, v in ((b"LOGIN", b"guest"), (b"PASSWORD", b"guest")))
    with StreamRaw(port) as client:
        assert client.authenticate(mechanism="AMQPLAIN", opaque=table) == OK


def test_peer_properties_tune_then_open(port):
    with StreamRaw(port) as client:
        client.request(0x11, string_map({"product": "raw"}))
        rest = client.read_key(0x8011)
        assert b"\x00\x07version\x00\x063.13.7" in rest  # the stream protocol's reference release
    with StreamRaw(port) as client:
        assert client.authenticate() == OK
        frame_max, heartbeat = struct.unpack(">II", client.read_key(0x14))
        assert (frame_max, heartbeat) == (1048576, 60)
        client.send(frame(0x14, struct.pack(">II", 65536, 0)))
        client.request(0x15, string("/"))
        rest = client.read_key(0x8015)
        assert struct.unpack_from(">H", rest, 4)[0] == OK
        assert b"advertised_host" in rest and b"advertised_port" in rest


def test_vhost_access_failure(port, http):
    with StreamRaw(port) as client:
        assert client.open("no-such-vhost") == VHOST_ACCESS_FAILURE
        assert client.closed()
    user, vhost = unique("u"), unique("vh")
    assert http.put("/api/users/" + user, {"password": "pw", "tags": ""}).status == 201
    assert http.put("/api/vhosts/" + segment(vhost)).status == 201
    with StreamRaw(port) as client:
        assert client.open(vhost, user, "pw") == VHOST_ACCESS_FAILURE


def test_permissions(port, http):
    user, vhost = unique("u"), unique("vh")
    assert http.put("/api/users/" + user, {"password": "pw", "tags": ""}).status == 201
    assert http.put("/api/vhosts/" + segment(vhost)).status == 201
    assert http.put("/api/permissions/%s/guest" % segment(vhost), ALL_PERMISSIONS).status in (201, 204)
    assert http.put("/api/permissions/%s/%s" % (segment(vhost), user),
                    {"configure": "", "write": "", "read": ".*"}).status in (201, 204)
    stream = unique("s")
    with opened(port, vhost) as admin:
        assert create(admin, stream) == OK
    with StreamRaw(port) as client:
        assert client.open(vhost, user, "pw") == OK
        assert create(client, unique("s")) == ACCESS_REFUSED
        client.request(0x0E, string(stream))
        assert client.response_code(0x0E) == ACCESS_REFUSED
        client.request(0x01, b"\x00", string(""), string(stream))
        assert client.response_code(0x01) == ACCESS_REFUSED
        client.request(0x07, b"\x00", string(stream), struct.pack(">HH", 1, 10), string_map({}))
        assert client.response_code(0x07) == OK


# -- requests and their codes --------------------------------------------------

def test_unknown_publisher_and_subscription(port):
    with opened(port) as client:
        client.send(frame(0x02, struct.pack(">Bi", 9, 1), struct.pack(">Q", 42) + struct.pack(">i", 1) + b"x"))
        rest = client.read_key(0x04)
        assert rest == struct.pack(">BiQH", 9, 1, 42, PUBLISHER_DOES_NOT_EXIST)
        client.send(frame(0x09, struct.pack(">BH", 5, 10)))
        # The only response to credit, without a correlation id.
        assert client.read_key(0x8009) == struct.pack(">HB", SUBSCRIPTION_ID_DOES_NOT_EXIST, 5)
        client.request(0x0C, b"\x05")
        assert client.response_code(0x0C) == SUBSCRIPTION_ID_DOES_NOT_EXIST
        client.request(0x06, b"\x05")
        assert client.response_code(0x06) == PUBLISHER_DOES_NOT_EXIST


def test_resolve_offset_spec_and_stream_stats(port):
    stream = unique("s")
    with opened(port) as client:
        assert create(client, stream) == OK
        client.request(0x1C, string(stream))
        rest = client.read_key(0x801C)
        assert b"first_chunk_id" in rest and struct.pack(">q", -1) in rest  # empty
        publish(client, stream, [b"a", b"b", b"c"])
        resolved = {}
        for name, spec in (("first", struct.pack(">H", 1)), ("last", struct.pack(">H", 2)),
                           ("next", struct.pack(">H", 3)), ("offset 1", struct.pack(">HQ", 4, 1)),
                           ("offset 100", struct.pack(">HQ", 4, 100)), ("timestamp 0", struct.pack(">Hq", 5, 0))):
            client.request(0x1F, string(stream), spec, string_map({}))
            rest = client.read_key(0x801F)
            code, kind, offset = struct.unpack_from(">HHQ", rest, 4)
            assert (code, kind) == (OK, 4)
            resolved[name] = offset
        assert resolved == {"first": 0, "last": 2, "next": 3, "offset 1": 1, "offset 100": 3, "timestamp 0": 0}
        client.request(0x1C, string(stream))
        rest = client.read_key(0x801C)
        stats = dict(zip(("first_chunk_id", "committed_chunk_id"), ()))
        pos, (count,) = 6, struct.unpack_from(">i", rest, 6)
        pos += 4
        for _ in range(count):
            (length,) = struct.unpack_from(">H", rest, pos)
            key = rest[pos + 2:pos + 2 + length].decode()
            stats[key] = struct.unpack_from(">q", rest, pos + 2 + length)[0]
            pos += 2 + length + 8
        assert stats == {"first_chunk_id": 0, "committed_chunk_id": 2}
        client.request(0x1F, string(unique("missing")), struct.pack(">H", 1), string_map({}))
        assert client.response_code(0x1F) == STREAM_DOES_NOT_EXIST


def test_exchange_command_versions_and_deliver_v2(port):
    stream = unique("s")
    with opened(port) as client:
        assert create(client, stream) == OK
        publish(client, stream, [b"a", b"b"])
        client.request(0x1B, struct.pack(">i", 2), struct.pack(">HHH", 2, 1, 2), struct.pack(">HHH", 8, 1, 2))
        rest = client.read_key(0x801B)
        (count,) = struct.unpack_from(">i", rest, 6)
        versions = [struct.unpack_from(">HHH", rest, 10 + 6 * i) for i in range(count)]
        assert versions[0] == (1, 1, 1) and (2, 1, 2) in versions and (8, 1, 2) in versions
        assert [v[0] for v in versions] == list(range(1, count + 1))
        client.request(0x07, b"\x01", string(stream), struct.pack(">HH", 1, 5), string_map({}))
        assert client.response_code(0x07) == OK
        found = client.read()
        while found[0] != 0x08:
            found = client.read()
        key, version, rest = found
        assert version == 2
        subscription, committed = struct.unpack_from(">BQ", rest)
        first_offset = struct.unpack_from(">Q", rest, 9 + 24)[0]
        assert (subscription, committed, first_offset) == (1, 1, 0)


def test_super_stream_commands(port):
    name = unique("ss")
    with opened(port) as client:
        def create_super(partitions, keys) -> int:
            client.request(0x1D, string(name), struct.pack(">i", len(partitions)),
                           b"".join(string(p) for p in partitions), struct.pack(">i", len(keys)),
                           b"".join(string(k) for k in keys), string_map({"max-age": "1h"}))
            return client.response_code(0x1D)
        assert create_super([name + "-a", name + "-b"], ["a"]) == 17  # precondition failed: keys != partitions
        assert create_super([name + "-a", name + "-b"], ["a", "b"]) == OK
        assert create_super([name + "-a", name + "-b"], ["a", "b"]) == 5  # stream already exists
        client.request(0x19, string(name))
        rest = client.read_key(0x8019)
        assert rest[4:6] == b"\x00\x01" and rest[6:] == struct.pack(">i", 2) + string(name + "-a") + string(name + "-b")
        client.request(0x18, string("b"), string(name))
        assert client.read_key(0x8018)[6:] == struct.pack(">i", 1) + string(name + "-b")
        client.request(0x1E, string(name))
        assert client.response_code(0x1E) == OK
        client.request(0x19, string(name))
        assert client.response_code(0x19) == STREAM_DOES_NOT_EXIST
        client.request(0x1E, string(name))
        assert client.response_code(0x1E) == STREAM_DOES_NOT_EXIST


def test_metadata(port):
    stream, missing = unique("s"), unique("missing")
    with opened(port) as client:
        assert create(client, stream) == OK
        client.request(0x0F, struct.pack(">i", 2), string(stream), string(missing))
        rest = client.read_key(0x800F)
        (brokers,) = struct.unpack_from(">i", rest, 4)
        assert brokers == 1
        (_ref, length) = struct.unpack_from(">HH", rest, 8)
        host = rest[12:12 + length].decode()
        (stream_port,) = struct.unpack_from(">I", rest, 12 + length)
        assert (host, stream_port) == ("127.0.0.1", port)
        entries = rest[16 + length:]
        assert entries == (struct.pack(">i", 2) + string(stream) + struct.pack(">HHi", OK, 0, 0)
                           + string(missing) + struct.pack(">HHi", STREAM_DOES_NOT_EXIST, 0xFFFF, 0))


# -- bad frames -------------------------------------------------------------------------

def close_code(client: StreamRaw) -> int | None:
    """The code of the Close the broker sent before closing the socket."""
    while True:
        found = client.read()
        if found is None:
            return None
        if found[0] == 0x16:
            return struct.unpack_from(">H", found[2], 4)[0]


def test_unknown_command_closes_with_unknown_frame(port, hutch):
    with opened(port) as client:
        client.send(frame(0x7777, b"whatever"))
        assert close_code(client) == UNKNOWN_FRAME
    with StreamRaw(port) as client:  # before Open: the socket closes without a Close, as RabbitMQ's
        client.request(0x0D, string("s"), string_map({}))
        assert close_code(client) is None
    with opened(port) as client:  # a frame that ends inside a field
        client.send(frame(0x0D, b"\x00\x00\x00\x01\x00\x05ab"))
        assert close_code(client) == UNKNOWN_FRAME
    assert "Traceback" not in hutch.log


def test_frame_too_large(port):
    with StreamRaw(port) as client:  # 8192 bytes until Open succeeds (then no Close, only the socket)
        client.request(0x11, string_map({"big": "x" * 9000}))
        assert close_code(client) is None and client.closed()
    with opened(port) as client:  # then the negotiated 1 MiB
        client.send(struct.pack(">I", 2 * 1024 * 1024) + b"\x00\x0d\x00\x01")
        assert close_code(client) == FRAME_TOO_LARGE


def _session(stream: str) -> list[bytes]:
    """A valid session's frames after the handshake, to mutate."""
    body = amqp(b"payload")
    plain = b"".join(struct.pack(">I", len(m)) + m for m in (amqp(b"one"), amqp(b"two")))
    packed = gzip.compress(plain)
    return [
        frame(0x0D, struct.pack(">I", 1), string(stream), string_map({"max-age": "1h"})),
        frame(0x01, struct.pack(">IB", 2, 3), string("ref"), string(stream)),
        frame(0x02, struct.pack(">Bi", 3, 2), struct.pack(">Q", 1) + struct.pack(">i", len(body)) + body,
              struct.pack(">Q", 2) + struct.pack(">i", len(body)) + body),
        # version 2 (a filter value per message) and a gzip sub-entry batch
        frame(0x02, struct.pack(">Bi", 3, 1), struct.pack(">Q", 3) + string("a") + struct.pack(">i", len(body)) + body,
              version=2),
        frame(0x02, struct.pack(">BiQBHii", 3, 1, 4, 0x80 | 1 << 4, 2, len(plain), len(packed)), packed),
        frame(0x07, struct.pack(">IB", 3, 1), string(stream), struct.pack(">HH", 1, 2),
              string_map({"filter.0": "a"})),
        frame(0x09, struct.pack(">BH", 1, 3)),
        frame(0x0A, string("r"), string(stream), struct.pack(">Q", 1)),
        frame(0x0B, struct.pack(">I", 4), string("r"), string(stream)),
        frame(0x0F, struct.pack(">Ii", 5, 1), string(stream)),
        frame(0x1F, struct.pack(">I", 6), string(stream), struct.pack(">HQ", 4, 1), string_map({})),
        frame(0x0C, struct.pack(">IB", 7, 1)),
        frame(0x0E, struct.pack(">I", 8), string(stream)),
    ]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if choice < 0.4 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice < 0.6 and data:
            del data[rng.randrange(len(data)):][:rng.randint(1, 8)]
        elif choice < 0.8:
            position = rng.randrange(len(data) + 1)
            data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            position = rng.randrange(len(data) + 1)
            data[position:position] = struct.pack(">i", rng.choice([-1, 0, 0x7FFFFFFF, 65535, 1 << 20]))
    return bytes(data)


def test_mutated_sessions(port, hutch):
    rng = random.Random(30)
    for case in range(150):
        stream = unique("fz")
        data = b"".join(_session(stream))
        with StreamRaw(port, timeout=10) as client:
            assert client.open() == OK
            try:
                client.send(_mutate(rng, data) + frame(0x16, struct.pack(">IH", 99, 1), string("done")))
                # A mutated size may make the broker wait for more of a frame: the end of
                # input ends that wait (the socket closes), and nothing hangs.
                client.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the broker closed first (it answered a bad frame)
            code = close_code(client)
            assert code in (None, UNKNOWN_FRAME, FRAME_TOO_LARGE), "case %d: close code %r" % (case, code)
    assert "Traceback" not in hutch.log and "internal error" not in hutch.log
    # Still serving: a fresh session publishes and reads back.
    stream = unique("s")
    with opened(port) as client:
        assert create(client, stream) == OK
        publish(client, stream, [b"after the fuzz"])
    wait_for(lambda: hutch.running(), what="the broker to be running")


def test_heartbeats(port):
    with StreamRaw(port) as client:
        assert client.authenticate() == OK
        client.read_key(0x14)
        client.send(frame(0x14, struct.pack(">II", 1048576, 1)))  # one second
        client.request(0x15, string("/"))
        assert client.response_code(0x15) == OK
        assert client.read_key(0x17) == b""  # the broker's heartbeat
        # Then nothing from us: closed after two silent intervals.
        assert client.closed()


def test_listed_by_the_management_api(port, http, hutch):
    stream = unique("s")
    with opened(port) as client:
        listed = wait_for(lambda: [c for c in http.get("/api/connections").body if c["protocol"] == "stream"],
                          what="the stream connection in /api/connections")
        assert listed[0]["user"] == "guest" and listed[0]["vhost"] == "/"
        assert create(client, stream) == OK
        client.request(0x07, b"\x00", string(stream), struct.pack(">HH", 3, 1), string_map({}))
        assert client.response_code(0x07) == OK
        # A subscription is one of the stream's consumers, as in RabbitMQ.
        assert http.get("/api/queues/%%2F/%s" % stream).body["consumers"] == 1
        assert http.get("/api/overview").status == 200
        for path in ("/metrics", "/metrics/per-object"):
            assert call(hutch.ports["PROMETHEUS"], "GET", path).status == 200


def test_confirmed_messages_survive_sigkill(start_broker):
    """Publish with confirms (and a publisher reference) until well past a
    thousand confirms, SIGKILL the broker, restart it: every confirmed
    message is there exactly once, in order, and the publisher sequence
    covers the highest confirmed id."""
    broker = start_broker(expect=("AMQP", "STREAM"))
    stream = unique("kill")
    confirmed: list[int] = []
    with opened(broker.ports["STREAM"]) as client:
        assert create(client, stream) == OK
        client.request(0x01, b"\x01", string("ref"), string(stream))
        assert client.response_code(0x01) == OK
        next_id = 1
        try:
            while True:
                batch = range(next_id, next_id + 50)
                client.send(frame(0x02, struct.pack(">Bi", 1, len(batch)), b"".join(
                    struct.pack(">Qi", i, len(amqp(b"%d" % i))) + amqp(b"%d" % i) for i in batch)))
                next_id += 50
                found = client.read()
                while found is not None and found[0] != 0x03:
                    found = client.read()
                if found is None:
                    break
                (count,) = struct.unpack_from(">i", found[2], 1)
                confirmed += [struct.unpack_from(">Q", found[2], 5 + 8 * i)[0] for i in range(count)]
                if len(confirmed) >= 1500 and broker.running():
                    broker.process.kill()  # SIGKILL with publishes in flight
        except OSError:
            pass  # the broker is gone
    broker.process.wait()
    assert len(confirmed) >= 1500
    broker = start_broker("--data-dir", str(broker.data_dir), expect=("AMQP", "STREAM"))
    with opened(broker.ports["STREAM"]) as client:
        client.request(0x05, string("ref"), string(stream))
        rest = client.read_key(0x8005)
        assert struct.unpack_from(">HQ", rest, 4)[0] == OK
        assert struct.unpack_from(">HQ", rest, 4)[1] >= max(confirmed)
        client.request(0x07, b"\x02", string(stream), struct.pack(">HH", 1, 0xFFFF), string_map({}))
        assert client.response_code(0x07) == OK
        bodies: list[bytes] = []
        while len(bodies) < max(confirmed):
            rest = client.read_key(0x08)
            entries = struct.unpack_from(">H", rest, 3)[0]
            pos = 1 + 48
            for _ in range(entries):
                (size,) = struct.unpack_from(">I", rest, pos)
                bodies.append(rest[pos + 4 + 5:pos + 4 + size])  # past the data section's 5-byte head
                pos += 4 + size
            client.send(frame(0x09, struct.pack(">BH", 2, 1)))
    numbers = [int(b) for b in bodies]
    assert numbers[:max(confirmed)] == list(range(1, max(confirmed) + 1))


def test_an_offset_stored_on_an_empty_stream_survives_a_restart(start_broker):
    broker = start_broker(expect=("AMQP", "STREAM"))
    stream = unique("empty")

    def query(port: int) -> tuple[int, int]:
        with opened(port) as client:
            client.request(0x0B, string("reader"), string(stream))
            return struct.unpack_from(">HQ", client.read_key(0x800B), 4)

    with opened(broker.ports["STREAM"]) as client:
        assert create(client, stream) == OK
        client.send(frame(0x0A, string("reader"), string(stream), struct.pack(">Q", 5)))
    wait_for(lambda: query(broker.ports["STREAM"]) == (OK, 5), what="the stored offset")
    broker.stop()  # a clean stop writes the snapshot
    broker = start_broker("--data-dir", str(broker.data_dir), expect=("AMQP", "STREAM"))
    assert query(broker.ports["STREAM"]) == (OK, 5)
    assert "Traceback" not in broker.log


def test_deleting_the_vhost_closes_its_stream_connections(port, http):
    vhost = unique("vh")
    assert http.put("/api/vhosts/" + segment(vhost)).status == 201
    assert http.put("/api/permissions/%s/guest" % segment(vhost), ALL_PERMISSIONS).status in (201, 204)
    with opened(port, vhost) as client:
        stream = unique("s")
        assert create(client, stream) == OK
        client.request(0x07, b"\x00", string(stream), struct.pack(">HH", 1, 10), string_map({}))
        assert client.response_code(0x07) == OK
        assert http.delete("/api/vhosts/" + segment(vhost)).status == 204
        # The server's Close (RabbitMQ's stream plugin sends one), then the socket closes.
        assert close_code(client) is not None
