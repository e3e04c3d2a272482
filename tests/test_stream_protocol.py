"""The RabbitMQ stream protocol (port 5552) from the outside, with the rstream
client: publish and confirm, deduplication, every offset specification,
server-side offsets, super streams, single active consumer, filtering,
metadata updates; and one log, two protocols (AMQP 0-9-1 and stream).
The same scenarios run against RabbitMQ in
tests/differential/test_diff_stream_protocol.py."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess

import cramjam
import pika
import pytest
from rstream import (AMQPMessage, ConsumerOffsetSpecification, FilterConfiguration, OffsetNotFound, OffsetSpecification,
                     OffsetType, RouteType, SuperStreamConsumer, SuperStreamProducer, amqp_decoder)
from rstream.compression import CompressionType, ICompressionCodec, StreamCompressionCodecs
from rstream.superstream import SuperStreamCreationOption

from conftest import ROOT, launch
from helpers import unavailable, unique, wait_for
from http_api import Api
from stream_scenarios import (consumer, create, deduplication, delete, offset_specs, producer, publish,
                              publish_confirm_consume, read, stream_errors, stored_offsets, until)

FIRST = ConsumerOffsetSpecification(OffsetType.FIRST, None)


@pytest.fixture(scope="module")
def hutch(tmp_path_factory):
    broker = launch(tmp_path_factory.mktemp("stream"), expect=("AMQP", "STREAM", "HTTP"))
    yield broker
    broker.stop()


@pytest.fixture
def port(hutch) -> int:
    return hutch.ports["STREAM"]


async def test_publish_confirm_consume(port):
    seen = await publish_confirm_consume(port, unique("s"))
    assert seen["confirmed"] == list(range(1, 21))
    assert seen["got"] == [(i, b"m%d" % i) for i in range(20)]


async def test_every_offset_specification(port):
    seen = await offset_specs(port, unique("s"))
    assert seen["first"] == [(i, b"a%d" % i) for i in range(10)] + [(10 + i, b"b%d" % i) for i in range(10)]
    assert seen["offset"] == [(i, b"a%d" % i) for i in range(5, 10)] + [(10 + i, b"b%d" % i) for i in range(10)]
    assert seen["timestamp"] == [b"b%d" % i for i in range(10)]
    assert seen["next"] == [(20, b"after-next")]


async def test_last_starts_at_the_newest_message(port):
    stream = unique("s")
    await create(port, stream)
    await publish(port, stream, [b"x", b"y", b"z"])
    assert await read(port, stream, ConsumerOffsetSpecification(OffsetType.LAST, None), 1) == [(2, b"z")]
    await delete(port, stream)


async def test_deduplication_by_publisher_reference(port):
    seen = await deduplication(port, unique("s"))
    assert seen["first"] == [1, 2, 3]
    assert seen["again"] == [2, 3, 4]  # duplicates are confirmed too, and not stored
    assert seen["sequences"] == {"ref-1": 4, "ref-2": 1, "none": 0}
    assert seen["got"] == [b"d1", b"d2", b"d3", b"d4", b"other"]


async def test_deduplication_survives_a_restart(start_broker):
    broker = start_broker(expect=("AMQP", "STREAM"))
    stream = unique("s")
    await create(broker.ports["STREAM"], stream)
    assert await publish(broker.ports["STREAM"], stream, [b"1", b"2"], publisher_name="p", ids=[1, 2]) == [1, 2]
    broker.process.kill()  # SIGKILL: no snapshot on the way out, the records carry the sequence
    broker.process.wait()
    broker = start_broker("--data-dir", str(broker.data_dir), expect=("AMQP", "STREAM"))
    port = broker.ports["STREAM"]
    assert await publish(port, stream, [b"2", b"3"], publisher_name="p", ids=[2, 3]) == [2, 3]
    got = await read(port, stream, FIRST, 3)
    assert [b for _o, b in got] == [b"1", b"2", b"3"]


async def test_server_side_offsets(port):
    seen = await stored_offsets(port, unique("s"))
    assert seen == {"missing": "OffsetNotFound", "stored": 3}


async def test_stream_errors(port):
    seen = await stream_errors(port, unique("s"))
    assert seen == {"create": "ok", "create again": "StreamAlreadyExists", "delete": "ok",
                    "delete again": "StreamDoesNotExist", "subscribe missing": "StreamDoesNotExist",
                    "publish missing": "StreamDoesNotExist"}


async def test_create_stream_arguments(port):
    stream = unique("s")
    # RabbitMQ 3.10 leaves a bad value unanswered; 3.13 answers precondition failed, as here.
    assert await create(port, stream, {"max-length-bytes": "lots"}) == "PreconditionFailed"
    assert await create(port, stream, {"unknown-argument": "1"}) == "PreconditionFailed"
    assert await create(port, stream, {"max-age": "1x"}) == "PreconditionFailed"
    # The Bloom filter size's range (16..255), as the queue argument's (RabbitMQ 3.13+)
    assert await create(port, stream, {"stream-filter-size-bytes": "15"}) == "PreconditionFailed"
    assert await create(port, stream, {"stream-filter-size-bytes": "256"}) == "PreconditionFailed"
    assert await create(port, stream, {"max-length-bytes": "1000000", "max-age": "1h",
                                       "stream-max-segment-size-bytes": "500000", "stream-filter-size-bytes": "255",
                                       "initial-cluster-size": "3", "queue-leader-locator": "least-leaders"}) == "ok"
    await delete(port, stream)


async def test_sub_entry_batches_plain_and_gzip(port):
    from rstream import CompressionType
    stream = unique("s")
    await create(port, stream)
    confirmed = []
    async with producer(port) as p:
        for kind in (CompressionType.No, CompressionType.Gzip):
            batch = [AMQPMessage(body=b"%s-%d" % (kind.name.encode(), i)) for i in range(5)]
            await p.send_sub_entry(stream, batch, compression_type=kind,
                                   on_publish_confirm=lambda status: confirmed.append(status.is_confirmed))
        await until(lambda: len(confirmed) == 2, what="two batch confirms")
    assert confirmed == [True, True]
    got = await read(port, stream, FIRST, 10)
    # Each message of a batch is a record of its own, with an offset of its own.
    assert got == [(i, b"No-%d" % i) for i in range(5)] + [(5 + i, b"Gzip-%d" % i) for i in range(5)]
    await delete(port, stream)


# The codecs of the Java stream client's two factories (tests/client_scripts/SubEntryCodecs.java)
# and the compression type each writes.
JAVA_CODECS = {"xerial-snappy": "Snappy", "commons-snappy": "Snappy", "lz4-java": "Lz4", "commons-lz4": "Lz4",
               "zstd-jni": "Zstd"}


def java_compressed(plain: dict[str, bytes], directory) -> dict[tuple[str, str], bytes]:
    """{(batch, codec): bytes} as the Java stream client's codecs compress
    each batch's bytes: its libraries (xerial snappy-java, lz4-java,
    zstd-jni, Commons Compress) from pyspark's jars, in one JVM."""
    java = shutil.which("java")
    try:
        import pyspark
    except ImportError:
        pyspark = None
    if java is None or pyspark is None:
        unavailable("java or pyspark (whose jars hold the Java stream client's compression libraries) missing")
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
    for name, data in plain.items():
        (directory / name).write_bytes(data)
    # C1 only (-XX:TieredStopAtLevel=1): compiling the source and a few batches is all this JVM does
    done = subprocess.run([java, "-XX:TieredStopAtLevel=1", "-cp", jars,
                           str(ROOT / "tests" / "client_scripts" / "SubEntryCodecs.java"),
                           *(str(directory / name) for name in plain)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {(name, codec): (directory / ("%s.%s" % (name, codec))).read_bytes() for name in plain
            for codec in JAVA_CODECS}


class JavaCompressed(ICompressionCodec):
    """rstream's codec interface (its way to add compression types) around
    what a Java client's codec made of the same sub-entry batch: rstream
    frames the batch and sends the Java client's bytes."""

    def __init__(self, kind: CompressionType, made: dict[bytes, bytes]) -> None:
        self.kind, self.made = kind, made
        self.plain = self.buffer = b""
        self.count = 0

    def compress(self, messages) -> None:
        self.plain = b"".join(len(bytes(m)).to_bytes(4, "big") + bytes(m) for m in messages)
        self.buffer, self.count = self.made[self.plain], len(messages)

    def uncompress(self, compressed_data: bytes, uncompressed_data_size: int) -> bytes:
        raise NotImplementedError  # hutch delivers messages uncompressed

    def compressed_size(self) -> int:
        return len(self.buffer)

    def uncompressed_size(self) -> int:
        return len(self.plain)

    def messages_count(self) -> int:
        return self.count

    def compression_type(self) -> int:
        return self.kind.value

    def data(self) -> bytes:
        return self.buffer


async def test_sub_entry_batches_snappy_lz4_zstd_as_the_java_client_compresses(hutch, port, tmp_path):
    """Snappy (framing format), LZ4 (frame format) and zstd batches, the
    bytes made by the Java stream client's own codecs, published with
    rstream: each message a record of its own, read back by a stream
    consumer and an AMQP 0-9-1 one; a batch that does not decompress to
    what its header says is refused with 17 and stores nothing."""
    stream = unique("s")
    await create(port, stream)
    batches = {codec: [AMQPMessage(body=b"%s-%d " % (codec.encode(), i) + b"the same words again " * 30)
                       for i in range(4)] for codec in JAVA_CODECS}
    plain = {codec: b"".join(len(bytes(m)).to_bytes(4, "big") + bytes(m) for m in messages)
             for codec, messages in batches.items()}
    made = java_compressed(plain, tmp_path)
    statuses = []
    registered = dict(StreamCompressionCodecs.available_compress_codecs)
    try:
        async with producer(port) as p:
            for codec, messages in batches.items():
                kind = CompressionType[JAVA_CODECS[codec]]
                compressed = made[(codec, codec)]
                assert len(compressed) < len(plain[codec]) // 4  # compressed indeed
                StreamCompressionCodecs.register_codec(kind, JavaCompressed(kind, {plain[codec]: compressed}))
                await p.send_sub_entry(stream, messages, compression_type=kind,
                                       on_publish_confirm=lambda status: statuses.append(status.is_confirmed))
            # zstd bytes that decompress to one byte more than the batch's header says: refused
            short = [AMQPMessage(body=b"short")]
            short_plain = len(bytes(short[0])).to_bytes(4, "big") + bytes(short[0])
            StreamCompressionCodecs.register_codec(CompressionType.Zstd, _Declaring(
                CompressionType.Zstd, bytes(cramjam.zstd.compress(short_plain + b"!")), len(short_plain), 1))
            await p.send_sub_entry(stream, short, compression_type=CompressionType.Zstd,
                                   on_publish_confirm=lambda status: statuses.append(status.response_code))
            await until(lambda: len(statuses) == 6, what="six batch confirms or errors")
    finally:
        StreamCompressionCodecs.available_compress_codecs.clear()
        StreamCompressionCodecs.available_compress_codecs.update(registered)
    # the error is sent at once, the confirms once on disk
    assert sorted(statuses, key=str) == [17] + [True] * 5
    expected = [bytes(m.body) for messages in batches.values() for m in messages]
    got = await read(port, stream, FIRST, 20)
    assert got == list(enumerate(expected))
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", hutch.ports["AMQP"])) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)
        seen = []
        channel.basic_consume(stream, lambda ch, method, props, body: seen.append(body),
                              arguments={"x-stream-offset": "first"})
        wait_for(lambda: connection.process_data_events(0.02) or len(seen) >= 20, 30, what="20 deliveries")
    assert seen == expected
    await delete(port, stream)


class _Declaring(JavaCompressed):
    """A codec that sends given bytes with a given uncompressed size and count."""

    def __init__(self, kind: CompressionType, data: bytes, size: int, count: int) -> None:
        super().__init__(kind, {})
        self.buffer, self.size, self.count = data, size, count

    def compress(self, messages) -> None:
        pass

    def uncompressed_size(self) -> int:
        return self.size


async def test_metadata_update_when_the_stream_is_deleted(port):
    stream = unique("s")
    await create(port, stream)
    told = []
    c = consumer(port, on_close_handler=lambda info: told.append((info.reason, list(info.streams))))
    await c.start()
    await c.subscribe(stream, lambda m, ctx: None, offset_specification=FIRST)
    await delete(port, stream)
    # rstream reports a MetadataUpdate for a subscribed stream this way.
    await until(lambda: ("Metadata Update", [stream]) in told, what="a metadata update")
    await c.close()


async def test_super_stream_route_partitions_and_consume(port):
    name = unique("ss")

    async def partition_key(message) -> str:
        return message.application_properties["k"]
    # RouteType.Key: the client asks the broker (route) for the partitions of a key.
    async with SuperStreamProducer("127.0.0.1", port=port, username="guest", password="guest",
                                   super_stream=name, routing_extractor=partition_key, routing=RouteType.Key,
                                   super_stream_creation_option=SuperStreamCreationOption(n_partitions=3)) as p:
        for i in range(30):
            await p.send(AMQPMessage(body=b"m%d" % i, application_properties={"k": str(i % 3)}))
        client = await p._producer.default_client  # noqa: SLF001 - route and partitions as the client asks them
        partitions = await client.partitions(name)
        route = await client.route("2", name)
    assert partitions == ["%s-%d" % (name, i) for i in range(3)]
    assert route == ["%s-2" % name]
    got = []
    c = SuperStreamConsumer("127.0.0.1", port=port, username="guest", password="guest", super_stream=name)
    await c.start()

    async def on_message(message, context) -> None:
        got.append(bytes(message.body))
    await c.subscribe(on_message, decoder=amqp_decoder, offset_specification=FIRST)
    await until(lambda: len(got) >= 30, what="30 messages over the partitions")
    await c.close()
    assert sorted(got) == sorted(b"m%d" % i for i in range(30))


async def test_single_active_consumer(port):
    stream = unique("s")
    await create(port, stream)
    got = {"a": [], "b": []}
    consumers = {}
    updates = {"a": [], "b": []}
    for who in ("a", "b"):
        c = consumers[who] = consumer(port)
        await c.start()

        async def on_update(active: bool, context, who=who):
            updates[who].append(active)
            return OffsetSpecification(OffsetType.FIRST, 0)

        async def on_message(message, context, who=who) -> None:
            got[who].append(bytes(message.body))
        await c.subscribe(stream, on_message, decoder=amqp_decoder, offset_specification=FIRST,
                          properties={"single-active-consumer": "true", "name": "group-1"},
                          consumer_update_listener=on_update)
    await publish(port, stream, [b"1", b"2", b"3"])
    await until(lambda: len(got["a"]) == 3, what="the first member to get everything")
    assert got["b"] == [] and updates == {"a": [True], "b": []}
    await consumers["a"].close()
    # The second member takes over, from where its update answer says.
    await until(lambda: len(got["b"]) == 3, what="the second member to take over")
    assert updates["b"] == [True]
    await consumers["b"].close()
    await delete(port, stream)


async def test_filtering(port):
    stream = unique("s")
    await create(port, stream)

    async def region_of(message) -> str | None:
        return message.application_properties.get("region")
    async with producer(port, filter_value_extractor=region_of) as p:
        confirmed = []
        # (rstream writes no filter field at all for a message without a
        # value, which no broker can parse: every message here has one.)
        for i, region in enumerate(["eu", "us", "eu", "us", "asia", "eu"]):
            await p.send(stream, AMQPMessage(body=b"%d" % i, application_properties={"region": region}),
                         on_publish_confirm=lambda s: confirmed.append(s))
        await until(lambda: len(confirmed) == 6, what="6 confirms")
    # The client's own predicate lets everything through: what arrives is the broker's filtering
    # (exact in hutch; RabbitMQ's Bloom filter may let more through, docs/streams.md).
    got = await read(port, stream, FIRST, 3, filter_input=FilterConfiguration(
        values_to_filter=["eu"], predicate=lambda m: True))
    assert [b for _o, b in got] == [b"0", b"2", b"5"]
    assert await publish(port, stream, [b"marker"]) == [1]
    got = await read(port, stream, FIRST, 4, filter_input=FilterConfiguration(
        values_to_filter=["eu"], predicate=lambda m: True, match_unfiltered=True))
    assert [b for _o, b in got] == [b"0", b"2", b"5", b"marker"]
    await delete(port, stream)


async def test_one_log_two_protocols(hutch, port):
    stream = unique("s")
    await create(port, stream)
    # AMQP 0-9-1 in, stream protocol out.
    with pika.BlockingConnection(pika.URLParameters(hutch.url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", stream, b"from-amqp", pika.BasicProperties(
            content_type="text/plain", headers={"h": "v", "n": 5, "x-k": "xv"}, message_id="m-1",
            correlation_id="c-1", delivery_mode=2, app_id="app", type="kind"))
    # Stream protocol in, AMQP 0-9-1 out.
    await publish(port, stream, [b"from-stream"], application_properties={"a": "b", "n": 7})
    received = []
    c = consumer(port)
    await c.start()

    async def on_message(message, context) -> None:
        received.append(message)
    await c.subscribe(stream, on_message, decoder=amqp_decoder, offset_specification=FIRST)
    await until(lambda: len(received) >= 2, what="two messages over the stream protocol")
    await c.close()
    amqp_message = received[0]
    assert bytes(amqp_message.body) == b"from-amqp"
    assert amqp_message.application_properties == {b"h": b"v", b"n": 5}
    assert amqp_message.properties.message_id == b"m-1"
    assert amqp_message.properties.content_type == b"text/plain"
    assert amqp_message.header.durable is True
    annotations = {k.decode() if isinstance(k, bytes) else k: v for k, v in amqp_message.message_annotations.items()}
    assert annotations["x-k"] == b"xv" and annotations["x-basic-type"] == b"kind"
    assert annotations["x-routing-key"] == stream.encode()
    assert bytes(received[1].body) == b"from-stream"

    def consume_amqp():
        with pika.BlockingConnection(pika.URLParameters(hutch.url)) as connection:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=10)
            out = []
            for method, properties, body in channel.consume(stream, arguments={"x-stream-offset": "first"},
                                                            inactivity_timeout=20):
                if method is None:
                    break
                out.append((body, properties.headers, properties.content_type, properties.message_id))
                channel.basic_ack(method.delivery_tag)
                if len(out) == 2:
                    break
            channel.cancel()
            return out
    out = await asyncio.get_running_loop().run_in_executor(None, consume_amqp)
    assert out[0][0] == b"from-amqp" and out[0][1]["h"] == "v" and out[0][3] == "m-1"
    assert out[1][0] == b"from-stream"
    assert out[1][1] == {"a": "b", "n": 7, "x-stream-offset": 1}
    # The management API's records (what Spark reads) and counts see both.
    api = Api(hutch.ports["HTTP"])
    records = api.get("/api/hutch/streams/%%2F/%s?start=0&limit=10" % stream).body["records"]
    assert [base64.b64decode(r["body"]) for r in records] == [b"from-amqp", b"from-stream"]
    assert records[1]["properties"]["headers"] == {"a": "b", "n": 7}
    assert wait_for(lambda: api.get("/api/queues/%%2F/%s" % stream).body.get("messages") == 2,
                    what="the stream's message count")
    await delete(port, stream)


async def test_filter_values_cross_protocols(hutch, port):
    stream = unique("s")
    await create(port, stream)
    with pika.BlockingConnection(pika.URLParameters(hutch.url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for region in ("eu", "us"):
            channel.basic_publish("", stream, b"amqp-" + region.encode(),
                                  pika.BasicProperties(headers={"x-stream-filter-value": region}))

    async def region_of(message) -> str:
        return message.application_properties["region"]
    async with producer(port, filter_value_extractor=region_of) as p:
        for region in ("eu", "us"):
            await p.send_wait(stream, AMQPMessage(body=b"stream-" + region.encode(),
                                                  application_properties={"region": region}))
    got = await read(port, stream, FIRST, 2, filter_input=FilterConfiguration(
        values_to_filter=["eu"], predicate=lambda m: True))
    assert [b for _o, b in got] == [b"amqp-eu", b"stream-eu"]

    def consume_amqp():
        with pika.BlockingConnection(pika.URLParameters(hutch.url)) as connection:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=10)
            out = []
            for method, _properties, body in channel.consume(
                    stream, arguments={"x-stream-offset": "first", "x-stream-filter": "eu"}, inactivity_timeout=20):
                if method is None:
                    break
                out.append(body)
                channel.basic_ack(method.delivery_tag)
                if len(out) == 2:
                    break
            channel.cancel()
            return out
    assert await asyncio.get_running_loop().run_in_executor(None, consume_amqp) == [b"amqp-eu", b"stream-eu"]
    await delete(port, stream)


def test_javascript_stream_client(port):
    """Another language's client: npm's rabbitmq-stream-js-client (installed by .ci/run into
    tests/client_scripts), publishing with a reference and confirms, then reading back."""
    script = ROOT / "tests" / "client_scripts" / "stream_round_trip.js"
    node = shutil.which("node")
    if node is None or not (script.parent / "node_modules" / "rabbitmq-stream-js-client").is_dir():
        unavailable("node or tests/client_scripts/node_modules missing (npm install --prefix tests/client_scripts)")
    done = subprocess.run([node, str(script), str(port), unique("js")], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"confirmed": [1, 2, 3, 4, 5], "sequence": 5,
                    "received": [{"offset": i, "body": "js-%d" % i, "i": i + 1} for i in range(5)]}


async def test_single_active_consumer_spreads_super_stream_partitions(port):
    name = unique("ss")
    partitions = [name + "-0", name + "-1"]

    async def partition_key(message) -> str:
        return message.application_properties["k"]

    async with SuperStreamProducer("127.0.0.1", port=port, username="guest", password="guest",
                                   super_stream=name, routing_extractor=partition_key,
                                   super_stream_creation_option=SuperStreamCreationOption(n_partitions=2)):
        pass  # creates the super stream
    got = {"a": [], "b": []}
    updates = {"a": [], "b": []}
    members = {}

    async def join(who: str) -> None:
        async def on_update(active: bool, context, who=who):
            updates[who].append((context.stream, active))
            return OffsetSpecification(OffsetType.NEXT, 0)

        async def on_message(message, context, who=who) -> None:
            got[who].append((context.stream, bytes(message.body)))
        c = members[who] = SuperStreamConsumer("127.0.0.1", port=port, username="guest", password="guest",
                                               super_stream=name)
        await c.start()
        await c.subscribe(on_message, decoder=amqp_decoder, offset_specification=FIRST,
                          properties={"single-active-consumer": "true", "name": "group", "super-stream": name},
                          consumer_update_listener=on_update)
    await join("a")
    await until(lambda: len(updates["a"]) == 2, what="both partitions active on the first member")
    assert sorted(updates["a"]) == [(partitions[0], True), (partitions[1], True)]
    await join("b")
    # Partition i goes to member i modulo 2: the second partition moves to b.
    await until(lambda: updates["b"] == [(partitions[1], True)] and (partitions[1], False) in updates["a"],
                what="the second partition to move to the second member")
    # (rstream's key routing caches the first key's route: publish to the partitions directly.)
    for key in ("0", "1", "0", "1"):
        await publish(port, partitions[int(key)], [("p" + key).encode()])
    await until(lambda: len(got["a"]) + len(got["b"]) == 4, what="four messages")
    assert got == {"a": [(partitions[0], b"p0")] * 2, "b": [(partitions[1], b"p1")] * 2}
    for c in members.values():
        await c.close()


async def test_bytes_that_are_no_amqp_message_reach_amqp_consumers_as_the_body(hutch, port):
    """The stream protocol lets a client publish any bytes (rstream's RawMessage): an AMQP 0-9-1
    consumer gets them as the body, without properties, and a stream consumer as they were."""
    from rstream import RawMessage
    stream = unique("s")
    await create(port, stream)
    async with producer(port) as p:
        await p.send_wait(stream, RawMessage(b"plain bytes"))
        await p.send_wait(stream, RawMessage(b"\x00\x53\x75\xa0\x20cut short"))
    raw = []
    c = consumer(port)
    await c.start()
    await c.subscribe(stream, lambda message, context: raw.append(bytes(message)), offset_specification=FIRST)
    await until(lambda: len(raw) == 2, what="two raw messages")
    await c.close()
    assert raw == [b"plain bytes", b"\x00\x53\x75\xa0\x20cut short"]

    def consume_amqp():
        with pika.BlockingConnection(pika.URLParameters(hutch.url)) as connection:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=10)
            out = []
            for method, _properties, body in channel.consume(stream, arguments={"x-stream-offset": "first"},
                                                             inactivity_timeout=20):
                if method is None:
                    break
                out.append(body)
                channel.basic_ack(method.delivery_tag)
                if len(out) == 2:
                    break
            channel.cancel()
            return out
    assert await asyncio.get_running_loop().run_in_executor(None, consume_amqp) == raw
    await delete(port, stream)


async def test_a_stream_declared_again_starts_with_no_sequences_or_offsets(hutch, port):
    """A stream deleted and created again under the same name (the same directory) keeps none
    of the old one's publisher sequences or stored offsets."""
    stream = unique("s")
    await create(port, stream)
    assert await publish(port, stream, [b"old-1", b"old-2"], publisher_name="ref", ids=[1, 2]) == [1, 2]
    c = consumer(port)
    await c.start()
    await c.store_offset(stream, "reader", 1)
    await c.close()
    wait_for(lambda: any("reader" in p.read_text() for p in hutch.data_dir.rglob("tracking.json")), 10,
             what="the old stream's tracking snapshot")
    await delete(port, stream)
    await create(port, stream)
    assert await publish(port, stream, [b"new-1", b"new-2"], publisher_name="ref", ids=[1, 2]) == [1, 2]
    assert [b for _o, b in await read(port, stream, FIRST, 2)] == [b"new-1", b"new-2"]
    c = consumer(port)
    await c.start()
    with pytest.raises(OffsetNotFound):
        await c.query_offset(stream, "reader")
    await c.close()
    await delete(port, stream)


async def test_retention_from_create_arguments(port):
    """max-length-bytes and stream-max-segment-size-bytes given at create apply to the log:
    whole old segments go, and a subscription from first starts at the oldest kept."""
    stream = unique("s")
    assert await create(port, stream, {"max-length-bytes": "20000", "stream-max-segment-size-bytes": "5000"}) == "ok"
    bodies = [b"%03d" % i + b"x" * 200 for i in range(200)]
    for start in range(0, 200, 50):
        await publish(port, stream, bodies[start:start + 50])
    got = await read(port, stream, FIRST, 1)
    first = got[0][0]
    assert 0 < first < 200 and got[0][1] == bodies[first]
    await delete(port, stream)
