"""The stream protocol's handshake (PROTOCOL.adoc "Authentication"): peer
properties, SASL (PLAIN, AMQPLAIN, and EXTERNAL with a TLS client
certificate: its subject's common name is the user), Tune, Open. A refused
login is answered after the login throttle's delay (shared with AMQP, MQTT
and HTTP) and the connection closes; an Open the vhost refuses (unknown
vhost, no permissions, a connection limit) gets VHOST_ACCESS_FAILURE and the
connection closes, as RabbitMQ does."""
from __future__ import annotations

import logging
import platform

from pamqp import decode as amqp_decode

from amqp_server.shared.client import CLOSED
from amqp_server.stream import codes, frames
from amqp_server.stream.frames import Fields
from vhosts.access import Access
from vhosts.errors import AMQPError
from vhosts.node import NODE

log = logging.getLogger("hutch.stream")

# The connection's states (connection.StreamConnection; then amqp_server.shared.client.CLOSED)
PEER, TUNING, OPENING, OPEN = "peer", "tuning", "opening", "open"

# As the AMQP face's server properties: the product is hutch, and `version`
# names the RabbitMQ release whose stream protocol it follows (clients read
# it to decide what the broker can do: single active consumer from 3.11,
# filtering from 3.13).
SERVER_PROPERTIES = {"product": "hutch", "version": "3.13.7", "platform": "Python " + platform.python_version(),
                     "copyright": "hutch contributors", "information": "hutch, the RabbitMQ stream protocol",
                     "cluster_name": NODE}


def peer_properties(conn, version: int, f: Fields) -> None:
    correlation = f.u32()
    conn.client_properties = f.string_map()
    conn.send(frames.response(codes.PEER_PROPERTIES, correlation, codes.OK,
                              frames.string_map(SERVER_PROPERTIES)))


def mechanisms(conn) -> list[str]:
    mechanisms = ["PLAIN", "AMQPLAIN"]
    if certificate_user(conn) is not None:
        mechanisms.append("EXTERNAL")
    return mechanisms


def certificate_user(conn) -> str | None:
    transport = conn.io.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if ssl_object is None:
        return None
    certificate = ssl_object.getpeercert()
    for rdn in (certificate or {}).get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return value
    return None


def sasl_handshake(conn, version: int, f: Fields) -> None:
    correlation = f.u32()
    conn.send(frames.response(codes.SASL_HANDSHAKE, correlation, codes.OK,
                              frames.array([frames.string(m) for m in mechanisms(conn)])))


def sasl_authenticate(conn, version: int, f: Fields) -> None:
    correlation = f.u32()
    mechanism = f.text()
    opaque = f.bytes_() or b""
    host = (conn.peer or ("",))[0]
    loopback = host in ("127.0.0.1", "::1") or host.startswith("127.")
    if mechanism not in mechanisms(conn):
        conn.send(frames.response(codes.SASL_AUTHENTICATE, correlation, codes.SASL_MECHANISM_NOT_SUPPORTED))
        return
    if mechanism == "EXTERNAL":
        username, password = certificate_user(conn), None
    elif mechanism == "PLAIN":
        parts = opaque.split(b"\0")
        if len(parts) != 3:
            conn.send(frames.response(codes.SASL_AUTHENTICATE, correlation, codes.SASL_ERROR))
            return
        username, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    else:  # AMQPLAIN: an AMQP 0-9-1 field table without its length
        try:
            _, table = amqp_decode.field_table(len(opaque).to_bytes(4, "big") + opaque)
            username, password = str(table["LOGIN"]), str(table["PASSWORD"])
        except Exception:  # pamqp raises various errors on bad tables
            conn.send(frames.response(codes.SASL_AUTHENTICATE, correlation, codes.SASL_ERROR))
            return
    user = conn.broker.users.get(username)
    if user is None or (password is not None and not user.authenticate(password)):
        refuse(conn, correlation, host, username, codes.AUTHENTICATION_FAILURE)
        return
    if username in conn.broker.loopback_users and not loopback:
        refuse(conn, correlation, host, username, codes.SASL_AUTHENTICATION_FAILURE_LOOPBACK)
        return
    conn.node.logins.succeeded(host, username)
    conn.user = user
    conn.auth_mechanism = mechanism
    conn.send(frames.response(codes.SASL_AUTHENTICATE, correlation, codes.OK))
    conn.state = TUNING
    conn.send(frames.frame(codes.TUNE, 1, frames.u32(conn.settings.frame_max), frames.u32(conn.settings.heartbeat)))


def refuse(conn, correlation: int, host: str, username: str, code: int) -> None:
    """A refused login: answered after the login throttle's delay (shared
    with AMQP, MQTT and HTTP), then the connection is closed."""
    log.info("stream connection from %s: login of user '%s' refused", conn.peer, username)
    conn.io.pause_reading()
    conn.state = CLOSED

    def answer() -> None:
        conn.output.append(frames.response(codes.SASL_AUTHENTICATE, correlation, code))
        conn.io.wake()
        conn.io.close()
    conn.timer.cancel()
    conn.timer = conn.io.call_later(conn.node.logins.failed(host, username), answer)


def tune(conn, version: int, f: Fields) -> None:
    frame_max, heartbeat = f.u32(), f.u32()
    ours = conn.settings.frame_max
    conn.frame_max = min(frame_max, ours) if frame_max and ours else (frame_max or ours)
    conn.heartbeat = min(heartbeat, conn.settings.heartbeat) if heartbeat and conn.settings.heartbeat else 0
    conn.state = OPENING


def open_vhost(conn, version: int, f: Fields) -> None:
    correlation = f.u32()
    name = f.text()
    try:
        conn.vhost = conn.broker.open_vhost(conn.user, name, conn)
    except AMQPError as exc:
        log.info("stream connection from %s: %s", conn.peer, exc.reply_text)
        conn.send(frames.response(codes.OPEN, correlation, codes.VHOST_ACCESS_FAILURE))
        conn.io.close()
        conn.lost()
        return
    conn.access = Access(conn.user, name)
    conn.state = OPEN
    conn.node.connections.add(conn)
    conn.reader.frame_max = conn.frame_max
    host, port = conn.node.advertised(conn)
    conn.send(frames.response(codes.OPEN, correlation, codes.OK,
                              frames.string_map({"advertised_host": host, "advertised_port": str(port)})))
    conn.timer.cancel()
    if conn.heartbeat:
        conn.timer = conn.io.call_later(conn.heartbeat, conn.beat)
