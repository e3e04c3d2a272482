"""One firehose scenario, run against any broker (hutch or RabbitMQ) through
its management API and raw AMQP: tracing on for a fresh vhost, a topic
exchange and a queue, publishes with and without properties (one with a
header table of hand-picked wire types and a CC key), gets (one requeued and
got again) and a consumer delivery. Returns every trace message as
(routing key, its headers with wire types), for tests to compare exactly."""
from __future__ import annotations

import datetime
import struct

from pamqp import commands, decode, header

from amqp_raw import RawClient
from helpers import unique, wait_for
from http_api import call, segment

ALL = {"configure": ".*", "write": ".*", "read": ".*"}
# The publisher's own header table, encoded by hand: its wire types
# (short-short int, unsigned short, bool, nested table) must reach the trace as sent.
HEADERS = (b"\x01hb\x05" + b"\x01uu\x01\x00" + b"\x01tt\x01" + b"\x02CCA\x00\x00\x00\x08S\x00\x00\x00\x03a.c"
           + b"\x01nF\x00\x00\x00\x09\x01sS\x00\x00\x00\x02ok")


def typed(data: bytes, pos: int = 0, end: int | None = None) -> list:
    """A field table as [(name, type, value)], nested tables and arrays too."""
    end = len(data) if end is None else end
    out = []
    while pos < end:
        name = data[pos + 1:pos + 1 + data[pos]].decode()
        pos += 1 + data[pos]
        kind, value, pos = _value(data, pos)
        out.append((name, kind, value))
    return out


def _value(data: bytes, pos: int):
    kind = chr(data[pos])
    if kind in "FA":
        (size,) = struct.unpack_from(">I", data, pos + 1)
        start = pos + 5
        if kind == "F":
            return kind, typed(data, start, start + size), start + size
        items, at = [], start
        while at < start + size:
            item_kind, item, at = _value(data, at)
            items.append((item_kind, item))
        return kind, items, start + size
    consumed, value = decode.embedded_value(data[pos:])
    return kind, value, pos + consumed


def headers_of(content_header: bytes) -> list:
    """The typed headers of a content header that has only headers."""
    (flags,) = struct.unpack_from(">H", content_header, 12)
    assert flags == 0x2000, hex(flags)
    (size,) = struct.unpack_from(">I", content_header, 14)
    return typed(content_header, 18, 18 + size)


def _get(client: RawClient, queue: str, no_ack: bool):
    client.send_frame(commands.Basic.Get(queue=queue, no_ack=no_ack), 1)
    _channel, reply = client.read_frame()
    if isinstance(reply, commands.Basic.GetEmpty):
        return None, None
    content_header, bodies = client.read_content(1)
    return reply, (content_header, b"".join(bodies))


def _publish(client: RawClient, exchange: str, key: str, body: bytes, raw_header: bytes | None = None) -> None:
    client.publish(key, body, exchange=exchange, header=raw_header)


def run(amqp_port: int, http_port: int, credentials=("guest", "guest")) -> list:
    vhost = unique("trace")
    x, q, traces = "fh-x", "fh-q", "fh-trace"  # the vhost is unique to the run
    api = lambda method, path, body=None: call(http_port, method, path, body, auth=credentials)  # noqa: E731
    assert api("PUT", "/api/vhosts/" + segment(vhost), {"tracing": True}).status == 201
    try:
        api("PUT", "/api/permissions/%s/%s" % (segment(vhost), credentials[0]), ALL)
        api("PUT", "/api/exchanges/%s/%s" % (segment(vhost), x), {"type": "topic", "durable": False})
        for name in (q, traces):
            api("PUT", "/api/queues/%s/%s" % (segment(vhost), name), {"durable": False})
        api("POST", "/api/bindings/%s/e/%s/q/%s" % (segment(vhost), x, q), {"routing_key": "a.*"})
        api("POST", "/api/bindings/%s/e/amq.rabbitmq.trace/q/%s" % (segment(vhost), traces), {"routing_key": "#"})
        with RawClient.connected(amqp_port, user=credentials[0], password=credentials[1], vhost=vhost,
                                 channels=(1,)) as client:
            props = commands.Basic.Properties(
                content_type="text/plain", delivery_mode=2, priority=3, correlation_id="c1", reply_to="r",
                expiration="60000", message_id="m1", timestamp=datetime.datetime(2023, 11, 14, tzinfo=datetime.timezone.utc),
                message_type="t", user_id=credentials[0], app_id="app")
            full = header.ContentHeader(0, 5, props).marshal()
            flags = struct.unpack_from(">H", full, 12)[0] | 0x2000
            # the headers table goes third, after content_type (no content_encoding)
            at = 14 + 1 + len("text/plain")
            with_headers = full[:12] + struct.pack(">H", flags) + full[14:at] + struct.pack(">I", len(HEADERS)) \
                + HEADERS + full[at:]
            _publish(client, x, "a.b", b"hello", with_headers)
            _publish(client, "", q, b"plain")
            _publish(client, x, "nomatch", b"unroutable")
            got, _content = _get(client, q, no_ack=False)
            client.send_frame(commands.Basic.Nack(delivery_tag=got.delivery_tag, requeue=True), 1)
            _get(client, q, no_ack=True)
            _get(client, q, no_ack=True)
            _publish(client, "", q, b"consumed")
            client.send_frame(commands.Basic.Consume(queue=q, no_ack=True), 1)
            client.expect(commands.Basic.ConsumeOk, 1)
            client.expect(commands.Basic.Deliver, 1)
            client.read_content(1)
            _publish(client, "", q, b"handed")  # to the waiting no-ack consumer at once (hutch: the hand-off)
            client.expect(commands.Basic.Deliver, 1)
            client.read_content(1)
            found = []

            def all_traced() -> bool:
                _got, content = _get(client, traces, no_ack=True)
                if content is not None:
                    found.append((_got.routing_key, content[1], headers_of(content[0])))
                return len(found) == 10

            wait_for(all_traced, timeout=10)
        return found
    finally:
        api("DELETE", "/api/vhosts/" + segment(vhost))


def normalised(found: list) -> list:
    """What differs between brokers and runs (node and connection names, the
    unique vhost name) as placeholders."""
    return [(key, body, [(name, kind, "<%s>" % name if name in ("node", "connection", "vhost") else value)
                         for name, kind, value in headers])
            for key, body, headers in found]
