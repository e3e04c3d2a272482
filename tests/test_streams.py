"""Stream queues beyond what the differential tests compare: time offsets,
retention by size (argument and policy), restarts (clean and SIGKILL under
confirmed publishing), the management API, Prometheus, hutchctl and
definitions. Real broker processes and real clients."""
from __future__ import annotations

import asyncio
import datetime
import os
import signal
import time
import urllib.request

import aiormq
import pika
import pytest

from conftest import BrokerProcess, launch
from helpers import unique, wait_for
from hutchctl_targets import hutchctl
from storage.vhost_storage import dir_name

STREAM = {"x-queue-type": "stream"}


def declare_stream(channel, name: str, **arguments) -> None:
    channel.queue_declare(name, durable=True, arguments={**STREAM, **arguments})


def read(connection, queue: str, count: int, offset="first", prefetch: int = 100, timeout: float = 20) -> list:
    """`count` deliveries of a new consumer at `offset`, acked as they come:
    [(x-stream-offset, body)]."""
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    got = []

    def on_message(ch, method, properties, body):
        got.append((properties.headers["x-stream-offset"], body))
        ch.basic_ack(method.delivery_tag)

    tag = channel.basic_consume(queue, on_message, arguments={"x-stream-offset": offset})
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    channel.basic_cancel(tag)
    channel.close()
    return got


def publish_confirmed(channel, queue: str, bodies) -> None:
    for body in bodies:
        channel.basic_publish("", queue, body)


def test_timestamp_and_interval_offsets(conn):
    name = unique("stream-time")
    channel = conn.channel()
    declare_stream(channel, name)
    channel.confirm_delivery()
    publish_confirmed(channel, name, [b"old-%d" % i for i in range(3)])
    boundary = datetime.datetime.now(datetime.timezone.utc)
    time.sleep(1.1)  # not a wait for the broker: AMQP timestamps count whole seconds, the records must differ
    publish_confirmed(channel, name, [b"new-%d" % i for i in range(2)])
    assert [b for _o, b in read(conn, name, 2, offset=boundary + datetime.timedelta(seconds=1))] == \
        [b"new-0", b"new-1"]
    assert len(read(conn, name, 5, offset="1h")) == 5
    assert [o for o, _b in read(conn, name, 5, offset=-3)] == [0, 1, 2, 3, 4]
    channel.queue_delete(name)


def segment_files(broker: BrokerProcess) -> list[str]:
    found = []
    for root, _dirs, files in os.walk(broker.data_dir / "vhosts"):
        if os.sep + "streams" + os.sep in root + os.sep:
            found += [f for f in files if f.endswith(".log")]
    return found


def test_retention_by_size_drops_whole_oldest_segments(broker, conn, api):
    name = unique("stream-retention")
    channel = conn.channel()
    declare_stream(channel, name, **{"x-max-length-bytes": 20000, "x-stream-max-segment-size-bytes": 5000})
    channel.confirm_delivery()
    publish_confirmed(channel, name, [b"%05d" % i + b"x" * 495 for i in range(200)])
    got = read(conn, name, 1)
    first = got[0][0]
    assert first > 0  # the oldest segments went
    assert got[0][1].startswith(b"%05d" % first)
    everything = read(conn, name, 200 - first)
    assert [o for o, _b in everything] == list(range(first, 200))
    queue = api.get("/api/queues/%2F/" + name).body
    assert queue["type"] == "stream"
    assert queue["messages"] == 200 - first
    assert 15000 <= queue["message_bytes"] <= 20000 + 5000
    channel.queue_delete(name)


def test_a_max_length_bytes_policy_applies_to_a_stream(conn, api):
    name = unique("stream-policy")
    channel = conn.channel()
    declare_stream(channel, name, **{"x-stream-max-segment-size-bytes": 5000})
    channel.confirm_delivery()
    publish_confirmed(channel, name, [b"y" * 500 for _ in range(100)])
    assert read(conn, name, 1)[0][0] == 0
    assert api.put("/api/policies/%2F/" + name, {
        "pattern": "^%s$" % name, "apply-to": "queues", "definition": {"max-length-bytes": 10000}}).status == 201
    publish_confirmed(channel, name, [b"z" * 500])  # retention runs when a segment rolls, or on a read
    assert wait_for(lambda: read(conn, name, 1)[0][0] > 50)
    api.delete("/api/policies/%2F/" + name)
    channel.queue_delete(name)


def test_prometheus_and_hutchctl_show_type_and_size(broker, conn, api):
    name = unique("stream-listed")
    channel = conn.channel()
    declare_stream(channel, name)
    channel.confirm_delivery()
    publish_confirmed(channel, name, [b"q" * 100] * 3)
    listed = {q["name"]: q for q in api.get("/api/queues").body}
    assert listed[name]["type"] == "stream" and listed[name]["messages"] == 3
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics/per-object" % broker.ports["PROMETHEUS"]) as reply:
        metrics = reply.read().decode()
    assert 'hutch_queue_info{vhost="/",queue="%s",type="stream"} 1' % name in metrics
    size = listed[name]["message_bytes"]
    assert 'rabbitmq_queue_messages_ready_bytes{vhost="/",queue="%s"} %d' % (name, size) in metrics
    out = hutchctl("list_queues", "name", "type", "messages", "message_bytes",
                   env={"HUTCH_URL": "http://127.0.0.1:%d" % broker.ports["HTTP"], "HUTCH_USERNAME": "guest",
                        "HUTCH_PASSWORD": "guest"}).stdout
    assert any(line.split() == [name, "stream", "3", str(size)] for line in out.splitlines())
    exported = api.get("/api/definitions").body
    assert {"name": name, "vhost": "/", "durable": True, "auto_delete": False, "arguments": STREAM} in [
        {k: q[k] for k in ("name", "vhost", "durable", "auto_delete", "arguments")} for q in exported["queues"]]
    channel.queue_delete(name)


def test_definitions_import_creates_streams(conn, api):
    name = unique("stream-imported")
    body = {"queues": [{"name": name, "vhost": "/", "durable": True, "auto_delete": False,
                        "arguments": {**STREAM, "x-max-age": "7D"}}]}
    assert api.post("/api/definitions", body).status in (200, 201, 204)
    assert api.get("/api/queues/%2F/" + name).body["type"] == "stream"
    channel = conn.channel()
    channel.basic_qos(prefetch_count=1)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker, match="basic.get not supported"):
        channel.basic_get(name)
    assert api.delete("/api/queues/%2F/" + name).status == 204


def test_records_survive_a_clean_restart_and_offsets_go_on(start_broker, tmp_path):
    first = start_broker()
    connection = pika.BlockingConnection(pika.URLParameters(first.url))
    channel = connection.channel()
    declare_stream(channel, "kept", **{"x-stream-max-segment-size-bytes": 2000})
    channel.confirm_delivery()
    publish_confirmed(channel, "kept", [b"before-%d" % i + b"." * 200 for i in range(30)])
    connection.close()
    first.stop()
    second = start_broker("--data-dir", str(first.data_dir))
    connection = pika.BlockingConnection(pika.URLParameters(second.url))
    channel = connection.channel()
    channel.confirm_delivery()
    publish_confirmed(channel, "kept", [b"after"])
    got = read(connection, "kept", 31)
    assert [o for o, _b in got] == list(range(31))
    assert got[0][1].startswith(b"before-0") and got[-1][1] == b"after"
    connection.close()


async def _publish_until_killed(broker: BrokerProcess, start_id: int, kill_after: int, confirmed: list) -> int:
    """Publish ascending ids with confirms (a window of 64) and SIGKILL the
    broker once `kill_after` were confirmed; returns the next id to use."""
    connection = await aiormq.connect(broker.url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.queue_declare("crashing", durable=True, arguments=STREAM)
    next_id = start_id
    window: set = set()

    async def one(n: int) -> None:
        try:
            await channel.basic_publish(b"%010d" % n + b"-" * (n % 300), routing_key="crashing")
            confirmed.append(n)
        except Exception:  # noqa: BLE001 - the broker is being killed: unconfirmed
            pass

    killed = False
    while not killed:
        while len(window) < 64:
            task = asyncio.ensure_future(one(next_id))
            window.add(task)
            task.add_done_callback(window.discard)
            next_id += 1
        await asyncio.wait(window, return_when=asyncio.FIRST_COMPLETED)
        if len([c for c in confirmed if c >= start_id]) >= kill_after:
            os.kill(broker.process.pid, signal.SIGKILL)
            killed = True
    if window:
        await asyncio.wait(window, timeout=10)
    broker.process.wait(10)
    return next_id


def test_sigkill_cycles_under_confirmed_publishing_keep_every_confirmed_record_once_in_order(tmp_path):
    data_dir = None
    confirmed: list[int] = []
    next_id = 0
    started = []
    try:
        for cycle, kill_after in enumerate((300, 700, 150)):
            broker = launch(tmp_path, *(("--data-dir", str(data_dir)) if data_dir else ()))
            started.append(broker)
            data_dir = data_dir or broker.data_dir
            next_id = asyncio.run(_publish_until_killed(broker, next_id, kill_after, confirmed))
        broker = launch(tmp_path, "--data-dir", str(data_dir))
        started.append(broker)
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        count = connection.channel().queue_declare("crashing", passive=True).method.message_count
        got = read(connection, "crashing", count, prefetch=1000)
        connection.close()
    finally:
        for broker in started:
            broker.stop()
    assert len(confirmed) >= 1150
    offsets = [o for o, _b in got]
    ids = [int(b[:10]) for _o, b in got]
    assert offsets == list(range(count))  # offsets run without a gap
    assert ids == sorted(set(ids))  # publish order kept, nothing twice
    assert set(confirmed) <= set(ids), sorted(set(confirmed) - set(ids))[:10]
    assert all(b == b"%010d" % n + b"-" * (n % 300) for n, (_o, b) in zip(ids, got))


FILTER_VALUES = ["red", "blue", None, "green"]  # record i's x-stream-filter-value: FILTER_VALUES[i % 4]


def filtered_pika(conn, queue: str, **arguments) -> tuple[list[int], bytes]:
    """What a pika consumer with these arguments (from "first" unless they
    say otherwise) gets up to the first end marker: (record numbers, the
    marker). The markers follow every numbered record, so whatever the
    consumer was to get has come by then."""
    channel = conn.channel()
    channel.basic_qos(prefetch_count=100)
    got = []

    def on_message(ch, method, properties, body):
        got.append(body)
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_message, arguments={"x-stream-offset": "first", **arguments})
    wait_for(lambda: conn.process_data_events(0.02) or any(b.startswith(b"end") for b in got), 30,
             what="an end marker")
    channel.close()
    return _up_to_marker(got)


def _up_to_marker(got: list[bytes]) -> tuple[list[int], bytes]:
    end = next(i for i, b in enumerate(got) if b.startswith(b"end"))
    return [int(b[:3]) for b in got[:end]], got[end]


async def filtered_aiormq(url: str, queue: str, arguments: dict) -> tuple[list[int], bytes]:
    """The same with aiormq."""
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=100)
        got: list[bytes] = []
        done = asyncio.get_running_loop().create_future()

        async def on_message(message):
            got.append(message.body)
            await message.channel.basic_ack(message.delivery.delivery_tag)
            if message.body.startswith(b"end") and not done.done():
                done.set_result(None)

        await channel.basic_consume(queue, on_message, arguments=arguments)
        await asyncio.wait_for(done, 30)
        return _up_to_marker(got)
    finally:
        await connection.close()


def test_filtering_as_rabbitmq_3_13(broker, conn):
    """Filtered consumers get exactly the matching records (hutch's filter
    is exact, docs/streams.md), across segments and from any offset, with
    RabbitMQ 3.13-4.x's reading of the arguments: a non-string filter means
    no filter, non-string list members are left out, a non-boolean
    x-stream-match-unfiltered is false."""
    name = unique("stream-filter")
    channel = conn.channel()
    declare_stream(channel, name, **{"x-stream-max-segment-size-bytes": 4000, "x-stream-filter-size-bytes": 32})
    channel.confirm_delivery()
    values = [FILTER_VALUES[i % 4] for i in range(60)]
    for i, value in enumerate(values):
        headers = {"x-stream-filter-value": value} if value else {}
        channel.basic_publish("", name, b"%03d" % i + b"." * 200, pika.BasicProperties(headers=headers))
    for value in ("red", "blue", "green"):
        channel.basic_publish("", name, b"end-" + value.encode(),
                              pika.BasicProperties(headers={"x-stream-filter-value": value}))
    segments = list((broker.data_dir / "vhosts" / dir_name("/") / "streams" / dir_name(name)).glob("*.log"))
    assert len(segments) >= 3, segments

    def matching(wanted, start=0, unfiltered=False):
        return [i for i in range(start, 60) if values[i] in wanted or (unfiltered and values[i] is None)]

    assert filtered_pika(conn, name, **{"x-stream-filter": "red"}) == (matching({"red"}), b"end-red")
    assert filtered_pika(conn, name, **{"x-stream-filter": ["blue", "green"], "x-stream-offset": 17}) == \
        (matching({"blue", "green"}, 17), b"end-blue")
    assert filtered_pika(conn, name, **{"x-stream-filter": ["blue"], "x-stream-match-unfiltered": True,
                                        "x-stream-offset": 30}) == \
        (matching({"blue"}, 30, unfiltered=True), b"end-blue")
    assert filtered_pika(conn, name) == (list(range(60)), b"end-red")
    # As RabbitMQ reads them: no filter; the list's strings; match-unfiltered false.
    assert filtered_pika(conn, name, **{"x-stream-filter": 5}) == (list(range(60)), b"end-red")
    assert filtered_pika(conn, name, **{"x-stream-filter": ["green", 7, True]}) == \
        (matching({"green"}), b"end-green")
    assert filtered_pika(conn, name, **{"x-stream-filter": "red", "x-stream-match-unfiltered": "yes"}) == \
        (matching({"red"}), b"end-red")
    # Another client, another start: aiormq from offset 41, green and the unfiltered records.
    assert asyncio.run(filtered_aiormq(broker.url, name, {
        "x-stream-offset": 41, "x-stream-filter": ["green"], "x-stream-match-unfiltered": True})) == \
        (matching({"green"}, 41, unfiltered=True), b"end-green")
    # A list without a string: RabbitMQ's reader crashes on it; hutch refuses it.
    bad = conn.channel()
    bad.basic_qos(prefetch_count=10)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="invalid arg 'x-stream-filter'"):
        bad.basic_consume(name, lambda *a: None, arguments={"x-stream-filter": [5]})
    channel.queue_delete(name)


@pytest.mark.parametrize("size, text", [
    (15, "Invalid value for x-stream-filter-size-bytes"),
    (256, "Invalid value for x-stream-filter-size-bytes"),
    (-1, "invalid arg 'x-stream-filter-size-bytes' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    ("a", "invalid arg 'x-stream-filter-size-bytes' for queue '{q}' in vhost '/': \"expected integer, got "
          "longstr\""),
])
def test_filter_size_bytes_is_checked_as_rabbitmq_4(conn, size, text):
    name = unique("stream-filter-size")
    channel = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        declare_stream(channel, name, **{"x-stream-filter-size-bytes": size})
    assert (refused.value.reply_code, refused.value.reply_text) == (406, "PRECONDITION_FAILED - " + text.format(q=name))


def test_super_streams_with_hutchctl(broker, conn, api):
    name = unique("super")
    env = {"HUTCH_URL": "http://127.0.0.1:%d" % broker.ports["HTTP"], "HUTCH_USERNAME": "guest",
           "HUTCH_PASSWORD": "guest"}
    added = hutchctl("add_super_stream", name, "--partitions", "3", "--max-age", "7D", env=env)
    assert added.returncode == 0, added.stderr
    assert "Super stream %s was created" % name in added.stdout
    assert api.get("/api/exchanges/%2F/" + name).body["arguments"] == {"x-super-stream": True}
    bindings = sorted((b["routing_key"], b["destination"], b["arguments"]["x-stream-partition-order"])
                      for b in api.get("/api/exchanges/%%2F/%s/bindings/source" % name).body)
    assert bindings == [(str(i), "%s-%d" % (name, i), i) for i in range(3)]
    for i in range(3):
        partition = api.get("/api/queues/%%2F/%s-%d" % (name, i)).body
        assert partition["type"] == "stream" and partition["arguments"]["x-max-age"] == "7D"
    channel = conn.channel()
    channel.confirm_delivery()
    channel.basic_publish(name, "1", b"to partition 1")
    assert read(conn, "%s-1" % name, 1) == [(0, b"to partition 1")]
    again = hutchctl("add_super_stream", name, "--partitions", "2", env=env)
    assert again.returncode != 0 and "already exists" in again.stderr
    usage = hutchctl("add_super_stream", name, env=env)
    assert usage.returncode != 0 and "--partitions or --routing-keys" in usage.stderr
    deleted = hutchctl("delete_super_stream", name, env=env)
    assert deleted.returncode == 0, deleted.stderr
    assert api.get("/api/exchanges/%2F/" + name).status == 404
    assert all(api.get("/api/queues/%%2F/%s-%d" % (name, i)).status == 404 for i in range(3))


def test_the_stream_endpoint_of_the_management_api(conn, api):
    name, classic = unique("stream-http"), unique("classic-http")
    channel = conn.channel()
    declare_stream(channel, name)
    channel.queue_declare(classic)
    channel.confirm_delivery()
    channel.basic_publish("", name, b"\x00\xffbytes", pika.BasicProperties(message_id="m1", headers={"k": "v"}))
    channel.basic_publish("", name, b"second")
    page = api.get("/api/hutch/streams/%%2F/%s?start=1&limit=5" % name)
    assert page.status == 200 and page.body["first_offset"] == 0 and page.body["next_offset"] == 2
    assert [r["offset"] for r in page.body["records"]] == [1]
    first = api.get("/api/hutch/streams/%%2F/%s?limit=1" % name).body["records"][0]
    assert first["routing_key"] == name and first["body"] == "AP9ieXRlcw=="
    assert first["properties"]["message_id"] == "m1" and first["properties"]["headers"] == {"k": "v"}
    refused = api.get("/api/hutch/streams/%%2F/%s" % classic)
    assert refused.status == 400 and "is not a stream" in refused.body["reason"]
    assert api.get("/api/hutch/streams/%2F/no-such-queue").status == 404
    got = api.post("/api/queues/%%2F/%s/get" % name, {"ackmode": "ack_requeue_true", "encoding": "auto", "count": 1})
    assert (got.status, got.body["reason"]) == (400, "540 basic.get not supported by stream queues "
                                                     "queue '%s' in vhost '/'" % name)  # RabbitMQ 3.10's answer
    channel.queue_delete(name)
    channel.queue_delete(classic)
