"""Stream-protocol scenarios with the rstream client, each run against a
broker's stream port and returning what the client observed, so the same
scenario checks hutch (tests/test_stream_protocol.py) and compares it with
RabbitMQ (tests/differential/test_diff_stream_protocol.py)."""
from __future__ import annotations

import asyncio
import time

from rstream import (AMQPMessage, ConfirmationStatus, Consumer, ConsumerOffsetSpecification, OffsetType, Producer,
                     amqp_decoder)
from rstream.exceptions import ServerError

HOST = "127.0.0.1"
CREDENTIALS = {"username": "guest", "password": "guest"}
FIRST_SPEC = ConsumerOffsetSpecification(OffsetType.FIRST, None)


async def until(predicate, timeout: float = 20.0, what: str = "the condition"):
    """Poll `predicate` on the loop (no sleeps as synchronisation)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for %s" % what)
        await asyncio.sleep(0.02)


def producer(port: int, **kwargs) -> Producer:
    return Producer(HOST, port=port, **CREDENTIALS, **kwargs)


def consumer(port: int, **kwargs) -> Consumer:
    return Consumer(HOST, port=port, **CREDENTIALS, **kwargs)


async def publish(port: int, stream: str, bodies: list[bytes], publisher_name: str | None = None,
                  ids: list[int] | None = None, **properties) -> list[int]:
    """Publish and wait for every confirm; the confirmed publishing ids."""
    confirmed: list[int] = []
    async with producer(port) as p:
        def on_confirm(status: ConfirmationStatus) -> None:
            if status.is_confirmed:
                confirmed.append(status.message_id)
        for i, body in enumerate(bodies):
            message = AMQPMessage(body=body, **properties)
            if ids:
                message.publishing_id = ids[i]
            await p.send(stream, message, publisher_name=publisher_name, on_publish_confirm=on_confirm)
        await until(lambda: len(confirmed) >= len(bodies), what="%d confirms" % len(bodies))
    return sorted(confirmed)


async def read(port: int, stream: str, spec: ConsumerOffsetSpecification, count: int,
               **subscribe) -> list[tuple[int, bytes]]:
    """(offset, body) of the first `count` messages a subscription from `spec` gets."""
    got: list[tuple[int, bytes]] = []
    c = consumer(port)
    await c.start()
    try:
        async def on_message(message, context) -> None:
            got.append((context.offset, bytes(message.body)))
        await c.subscribe(stream, on_message, decoder=amqp_decoder, offset_specification=spec, **subscribe)
        await until(lambda: len(got) >= count, what="%d messages from %s" % (count, stream))
    finally:
        await c.close()
    return got[:count]


async def create(port: int, stream: str, arguments: dict | None = None) -> str:
    """'ok' or the server's error class name."""
    async with producer(port) as p:
        try:
            await p.create_stream(stream, arguments=arguments)
        except ServerError as exc:
            return type(exc).__name__
    return "ok"


async def delete(port: int, stream: str) -> str:
    async with producer(port) as p:
        try:
            await p.delete_stream(stream)
        except ServerError as exc:
            return type(exc).__name__
    return "ok"


# -- scenarios (each returns what it observed) ----------------------------------------

async def publish_confirm_consume(port: int, stream: str) -> dict:
    await create(port, stream)
    bodies = [b"m%d" % i for i in range(20)]
    confirmed = await publish(port, stream, bodies)
    got = await read(port, stream, ConsumerOffsetSpecification(OffsetType.FIRST, None), 20)
    await delete(port, stream)
    return {"confirmed": confirmed, "got": got}


async def offset_specs(port: int, stream: str) -> dict:
    """first, offset 5, next, and a timestamp (rstream drops what a
    subscription from an offset gets below that offset, so an offset past
    the end cannot be seen through it)."""
    await create(port, stream)
    await publish(port, stream, [b"a%d" % i for i in range(10)])
    before_second = int(time.time() * 1000)
    # A timestamp strictly after the first batch's appends (ms clocks).
    while int(time.time() * 1000) <= before_second:
        await asyncio.sleep(0.001)
    stamp = int(time.time() * 1000)
    await publish(port, stream, [b"b%d" % i for i in range(10)])
    first = await read(port, stream, ConsumerOffsetSpecification(OffsetType.FIRST, None), 20)
    at_offset = await read(port, stream, ConsumerOffsetSpecification(OffsetType.OFFSET, 5), 15)
    by_time = await read(port, stream, ConsumerOffsetSpecification(OffsetType.TIMESTAMP, stamp), 10)

    async def later(spec: ConsumerOffsetSpecification, marker: bytes) -> list:
        """What a subscription from `spec` gets, once `marker` is published after it."""
        got: list = []
        c = consumer(port)
        await c.start()
        try:
            async def on_message(message, context) -> None:
                got.append((context.offset, bytes(message.body)))
            await c.subscribe(stream, on_message, decoder=amqp_decoder, offset_specification=spec)
            await publish(port, stream, [marker])
            await until(lambda: any(body == marker for _o, body in got), what=marker)
        finally:
            await c.close()
        return got
    nxt = await later(ConsumerOffsetSpecification(OffsetType.NEXT, None), b"after-next")
    await delete(port, stream)
    return {"first": first, "offset": at_offset, "timestamp": [b for _o, b in by_time], "next": nxt}


async def deduplication(port: int, stream: str) -> dict:
    await create(port, stream)
    first = await publish(port, stream, [b"d1", b"d2", b"d3"], publisher_name="ref-1", ids=[1, 2, 3])
    again = await publish(port, stream, [b"d2", b"d3", b"d4"], publisher_name="ref-1", ids=[2, 3, 4])
    async with producer(port) as p:
        await p.send_wait(stream, AMQPMessage(body=b"other"), publisher_name="ref-2")
        client = await p.default_client
        sequences = {ref: await client.query_publisher_sequence(stream, ref) for ref in ("ref-1", "ref-2", "none")}
    got = await read(port, stream, ConsumerOffsetSpecification(OffsetType.FIRST, None), 5)
    await delete(port, stream)
    return {"first": first, "again": again, "sequences": sequences, "got": [b for _o, b in got]}


async def stored_offsets(port: int, stream: str) -> dict:
    await create(port, stream)
    await publish(port, stream, [b"o%d" % i for i in range(5)])
    c = consumer(port)
    await c.start()
    try:
        try:
            await c.query_offset(stream, "nobody")
            missing = "found"
        except ServerError as exc:
            missing = type(exc).__name__
        await c.store_offset(stream, "reader-1", 3)
        # store_offset has no response: poll until the query sees it.
        stored = []

        async def query() -> None:
            stored.append(await c.query_offset(stream, "reader-1"))
        deadline = time.monotonic() + 20
        while (not stored or stored[-1] != 3) and time.monotonic() < deadline:
            try:
                await query()
            except ServerError:
                await asyncio.sleep(0.05)
    finally:
        await c.close()
    await delete(port, stream)
    return {"missing": missing, "stored": stored[-1] if stored else None}


async def stream_errors(port: int, stream: str) -> dict:
    """Create twice, delete twice, subscribe to and publish on a missing stream."""
    out = {"create": await create(port, stream), "create again": await create(port, stream)}
    out["delete"] = await delete(port, stream)
    out["delete again"] = await delete(port, stream)
    c = consumer(port)
    await c.start()
    try:
        await c.subscribe(stream, lambda m, ctx: None)
        out["subscribe missing"] = "ok"
    except ServerError as exc:
        out["subscribe missing"] = type(exc).__name__
    finally:
        await c.close()
    async with producer(port) as p:
        try:
            await p.send_wait(stream, AMQPMessage(body=b"x"))
            out["publish missing"] = "ok"
        except ServerError as exc:
            out["publish missing"] = type(exc).__name__
    return out


def raw_codes(port: int, stream: str) -> dict:
    """Response codes of requests no client library sends wrong, over a raw
    socket (tests/stream_raw.py): what each broker answers."""
    import struct

    from stream_raw import StreamRaw, frame, string, string_map
    out = {}
    with StreamRaw(port) as client:
        out["wrong password"] = client.authenticate("guest", "wrong")
    with StreamRaw(port) as client:
        out["unknown mechanism"] = client.authenticate(mechanism="NOPE")
    with StreamRaw(port) as client:
        out["unknown vhost"] = client.open("no-such-vhost-" + stream)
    with StreamRaw(port) as client:
        assert client.open() == 1
        client.request(0x01, b"\x05", string(""), string(stream))
        out["declare publisher, no stream"] = client.response_code(0x01)
        client.request(0x07, b"\x05", string(stream), struct.pack(">HH", 1, 1), string_map({}))
        out["subscribe, no stream"] = client.response_code(0x07)
        client.send(frame(0x02, struct.pack(">BiQi", 9, 1, 42, 1) + b"x"))
        out["publish, no publisher"] = client.read_key(0x04).hex()
        client.send(frame(0x09, struct.pack(">BH", 5, 10)))
        out["credit, no subscription"] = client.read_key(0x8009).hex()
        client.request(0x0C, b"\x05")
        out["unsubscribe, no subscription"] = client.response_code(0x0C)
        client.request(0x06, b"\x05")
        out["delete publisher, none"] = client.response_code(0x06)
        client.request(0x0B, string("nobody"), string(stream))
        out["query offset, no stream"] = client.response_code(0x0B)
        client.request(0x0E, string(stream))
        out["delete, no stream"] = client.response_code(0x0E)
        client.request(0x0F, struct.pack(">i", 1), string(stream))
        out["metadata, no stream"] = client.read_key(0x800F)[4:].hex()
        client.send(frame(0x7777, b"whatever"))
        out["unknown command"] = _close_code(client)
    with StreamRaw(port) as client:
        client.send(frame(0x7777, b"whatever"))
        out["unknown command before the handshake"] = _close_code(client)
    return out


def _close_code(client) -> int | None:
    """The code of the Close the broker sends before closing the socket (None: no Close)."""
    import struct
    while True:
        found = client.read()
        if found is None:
            return None
        if found[0] == 0x16:
            return struct.unpack_from(">H", found[2], 4)[0]
