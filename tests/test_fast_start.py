"""A clean stop leaves recovery summaries; the next start loads them instead
of scanning every queue index segment and message store file
(storage/summary.py, docs/storage.md "Recovery").

Real broker processes on one data directory and a real client (pika). The
world: a fanout exchange feeding two durable queues (so message store bodies
have two references), persistent messages of mixed sizes (embedded in the
index, or in the store), with every property, interleaved with transient
ones; more than a queue keeps in RAM, so transient ones are paged into the
index too, and small segments and store files so there are several of each.
One message is fetched and left unacked before the stop.

What a user observes: the log says which way each start went, and every
persistent message comes back in order, intact, with its redelivered flag,
whichever way; transient ones never do.

On a node of several shards (TEST_SHARDS) each shard keeps the files of its
own queues and its own message store (DATA_DIR for shard 0, DATA_DIR/shards/K
for the others: docs/scaling.md), so the summaries are counted over every
shard's directory: one per queue index, one per shard's store. (The two
queues may then live on two shards, each storing its own copy of a body.)
"""
from __future__ import annotations

import asyncio
import glob
import os
import re

import aio_pika
import pika
import pytest
from aiormq import spec

from helpers import confirm_channel, connect
from test_torn_writes import brokers, start as start_broker, stop as clean_stop  # noqa: F401 (fixture)

FLAGS = ("--storage-segment-entries", "512", "--storage-msg-store-file-size", "200000")
QUEUES = ("q1", "q2")
PERSISTENT_COUNT = 2400  # more than a queue holds in RAM (2048): the rest is paged into the index
SUMMARY_USED = "loaded from its recovery summary (no scan)"
# A queue's index scanned (the delayed-message store, vhosts/<dir>/delayed,
# is always read whole: it keeps its messages in RAM).
SCANNED = re.compile(r"queue index \S+/queues/\S+: \d+ entries in \d+ segment\(s\), \d+ records")


def body(i: int) -> bytes:
    size = 6000 if i % 7 == 0 else 40  # every seventh in the message store, the others embedded
    return (b"%05d|" % i) * (size // 6 + 1)


def properties(i: int) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2, content_type="text/x-%d" % i, priority=i % 10,
                                correlation_id="c%d" % i, headers={"i": i, "tag": ["a", i]})


def start(tmp_path, brokers, data_dir=None):
    return start_broker(tmp_path, brokers, data_dir, flags=FLAGS)


def kill(proc) -> None:
    proc.process.kill()
    proc.process.wait()


async def publish_everything(port: int) -> None:
    """The exchange, the queues and every message, in order, each confirmed.
    The confirms are awaited together, not one by one: a publisher that
    waits for each confirm waits for a disk write per message (18.5 s for
    these 2,880 messages on a loaded 2-core machine, 1.7 s this way), and
    each test here fills a broker."""
    connection = await aio_pika.connect("amqp://guest:guest@127.0.0.1:%d/" % port)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        fan = await channel.declare_exchange("fan", "fanout", durable=True)
        for name in QUEUES:
            queue = await channel.declare_queue(name, durable=True)
            await queue.bind(fan)
        underlay = await channel.get_underlay_channel()
        confirms = []
        for i in range(PERSISTENT_COUNT):
            # tasks made in order take the channel's lock in order: the publishes go out in order
            confirms.append(asyncio.ensure_future(underlay.basic_publish(
                body(i), exchange="fan", properties=amqp_properties(properties(i)))))
            if i % 5 == 0:
                confirms.append(asyncio.ensure_future(underlay.basic_publish(
                    b"transient %d" % i, exchange="fan", properties=spec.Basic.Properties(delivery_mode=1))))
        for confirm in await asyncio.gather(*confirms):
            assert isinstance(confirm, spec.Basic.Ack), confirm


def amqp_properties(props: pika.BasicProperties) -> spec.Basic.Properties:
    return spec.Basic.Properties(delivery_mode=props.delivery_mode, content_type=props.content_type,
                                 priority=props.priority, correlation_id=props.correlation_id,
                                 headers=props.headers)


def fill(port: int) -> pika.BlockingConnection:
    """The world of the module docstring; q1's first message is delivered
    and left unacked while the broker stops."""
    asyncio.run(publish_everything(port))
    connection = connect(port)
    channel = connection.channel()
    method, _props, got = channel.basic_get("q1")
    assert got == body(0) and not method.redelivered
    return connection  # kept open: the fetched message stays unacked until the stop


def check_everything_served(port: int, unclean: bool = False) -> None:
    """Every persistent message, in order, intact, with its properties, in
    both queues; redelivered: q1's first one (delivered before the stop), or
    all of them after an unclean stop (RabbitMQ's rule)."""
    with connect(port) as connection:
        channel = connection.channel()
        for queue in QUEUES:
            assert channel.queue_declare(queue, passive=True).method.message_count == PERSISTENT_COUNT
        for queue in QUEUES:  # q1 first: its acks drop one of the two references of each stored body
            got = []
            while True:
                method, props, got_body = channel.basic_get(queue, auto_ack=True)
                if method is None:
                    break
                got.append((method.redelivered, props, got_body))
            assert [b[:6] for _r, _p, b in got] == [body(i)[:6] for i in range(PERSISTENT_COUNT)], queue
            assert [b for _r, _p, b in got] == [body(i) for i in range(PERSISTENT_COUNT)], queue
            for i, (_r, props, _b) in enumerate(got):
                expected = properties(i)
                assert (props.delivery_mode, props.content_type, props.priority, props.correlation_id,
                        props.headers) == (2, expected.content_type, expected.priority,
                                           expected.correlation_id, expected.headers)
            redelivered = [r for r, _p, _b in got]
            if unclean:
                assert all(redelivered), queue
            else:
                assert redelivered == [queue == "q1"] + [False] * (PERSISTENT_COUNT - 1), queue


def shard_dirs(data_dir) -> list[str]:
    """The data directory of each shard of the node (only DATA_DIR for one process)."""
    return [str(data_dir)] + sorted(glob.glob(os.path.join(str(data_dir), "shards", "*")))


def summaries(data_dir) -> list[str]:
    return sorted(path for directory in shard_dirs(data_dir)
                  for path in glob.glob(os.path.join(directory, "vhosts", "*", "**", "recovery.summary*"),
                                        recursive=True))


def queue_and_store_summaries(data_dir) -> tuple[int, int]:
    paths = summaries(data_dir)
    queues = sum(os.sep + "queues" + os.sep in path for path in paths)
    stores = sum("msg_store_persistent" in path for path in paths)
    assert queues + stores == len(paths), paths
    return queues, stores


def test_clean_restart_loads_the_summaries_and_serves_everything(tmp_path, brokers):
    first = start(tmp_path, brokers)
    client = fill(first.port)  # noqa: F841 (open until the stop)
    clean_stop(first)
    # two queue indexes, the persistent store (of each shard)
    assert queue_and_store_summaries(first.data_dir) == (2, len(shard_dirs(first.data_dir)))
    written = len(summaries(first.data_dir))

    second = start(tmp_path, brokers, first.data_dir)
    assert "clean-shutdown marker found" in second.log
    assert second.log.count(SUMMARY_USED) == written, second.log
    assert not SCANNED.search(second.log), second.log
    assert "recovered:" not in second.log  # the message store's scan line
    assert "recovery summary not used" not in second.log
    assert summaries(first.data_dir) == []  # removed as soon as loaded
    check_everything_served(second.port)

    clean_stop(second)  # everything was consumed: the next start finds empty queues
    assert queue_and_store_summaries(first.data_dir) == (2, len(shard_dirs(first.data_dir)))
    third = start(tmp_path, brokers, first.data_dir)
    assert third.log.count(SUMMARY_USED) == written, third.log
    with connect(third.port) as connection:
        for queue in QUEUES:
            assert connection.channel().queue_declare(queue, passive=True).method.message_count == 0
    assert "Traceback" not in first.log + second.log + third.log


def test_crash_after_a_clean_start_scans(tmp_path, brokers):
    """A start that loaded the summaries, then a crash: the next start has
    neither marker nor summaries, scans, and still serves everything."""
    first = start(tmp_path, brokers)
    client = fill(first.port)  # noqa: F841 (open until the stop)
    clean_stop(first)
    written = len(summaries(first.data_dir))
    second = start(tmp_path, brokers, first.data_dir)
    assert second.log.count(SUMMARY_USED) == written, second.log
    kill(second)
    assert summaries(first.data_dir) == []
    third = start(tmp_path, brokers, first.data_dir)
    assert "no clean-shutdown marker" in third.log
    assert SUMMARY_USED not in third.log
    assert len(SCANNED.findall(third.log)) == 2, third.log
    check_everything_served(third.port, unclean=True)


def test_crash_scans_and_ignores_summaries_left_behind(tmp_path, brokers):
    """Killed while serving: no marker, so every file is scanned, even when
    summaries of an older clean stop lie around (they are removed)."""
    first = start(tmp_path, brokers)
    client = fill(first.port)  # noqa: F841 (open until the stop)
    clean_stop(first)
    stale = {path: open(path, "rb").read() for path in summaries(first.data_dir)}
    second = start(tmp_path, brokers, first.data_dir)
    kill(second)
    for path, data in stale.items():  # as if that start had died before loading them
        with open(path, "wb") as f:
            f.write(data)
    third = start(tmp_path, brokers, first.data_dir)
    assert "no clean-shutdown marker" in third.log
    assert SUMMARY_USED not in third.log
    assert len(SCANNED.findall(third.log)) == 2, third.log
    assert summaries(first.data_dir) == []
    check_everything_served(third.port, unclean=True)


def _queue_summary(data_dir) -> str:
    return next(path for path in summaries(data_dir) if os.sep + "queues" + os.sep in path)


def _store_summary(data_dir) -> str:
    return next(path for path in summaries(data_dir) if "msg_store_persistent" in path)


# Each tampering returns what the log says and how many summaries it costs: a
# queue's own, and its store's (scanned too, for the reference counts), or
# only the store's. The other queue's summary, and any other shard's, are used.


def delete_a_queue_summary(data_dir):
    os.unlink(_queue_summary(data_dir))
    return "no summary", 2


def flip_a_byte_in_a_queue_summary(data_dir):
    path = _queue_summary(data_dir)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x55
    open(path, "wb").write(bytes(data))
    return "the summary is damaged", 2


def delete_the_store_summary(data_dir):
    os.unlink(_store_summary(data_dir))
    return "no summary", 1


def _files(data_dir, *pattern) -> list[str]:
    return sorted(path for directory in shard_dirs(data_dir)
                  for path in glob.glob(os.path.join(directory, "vhosts", "*", *pattern)))


def append_to_a_segment(data_dir):
    with open(_files(data_dir, "queues", "*", "*.idx")[0], "ab") as f:
        f.write(b"\x00" * 7)
    return "changed since the stop", 2


def rewrite_a_store_file(data_dir):
    """Same size, same bytes, but written again after the stop."""
    path = _files(data_dir, "msg_store_persistent", "*.rdq")[0]
    data = open(path, "rb").read()
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(data)
    return "changed since the stop", 1


@pytest.mark.parametrize("tamper", [delete_a_queue_summary, flip_a_byte_in_a_queue_summary,
                                    delete_the_store_summary, append_to_a_segment, rewrite_a_store_file],
                         ids=lambda f: f.__name__)
def test_a_missing_or_mismatched_summary_falls_back_to_the_scan(tmp_path, brokers, tamper):
    """What the summary does not vouch for is scanned (and the log says
    why); the message store is scanned too whenever a queue was, so its
    reference counts come from the indexes; everything is still served."""
    first = start(tmp_path, brokers)
    client = fill(first.port)  # noqa: F841 (open until the stop)
    clean_stop(first)
    written = len(summaries(first.data_dir))
    why, unused = tamper(first.data_dir)

    second = start(tmp_path, brokers, first.data_dir)
    assert "no clean-shutdown marker" not in second.log
    assert re.search(r"recovery summary not used \([^)]*%s" % re.escape(why), second.log), second.log
    assert second.log.count(SUMMARY_USED) == written - unused, second.log
    assert "message store" in second.log and "recovered:" in second.log  # the store was scanned
    check_everything_served(second.port)
    assert "Traceback" not in second.log


def test_empty_and_deleted_queues_leave_the_summaries_usable(tmp_path, brokers):
    """An empty durable queue needs no summary (nothing to scan), a deleted
    one's references left the store with it: the store's summary still
    counts exactly the references of the queues that come back."""
    first = start(tmp_path, brokers)
    with connect(first.port) as connection:
        channel = confirm_channel(connection)
        for queue in ("empty", "gone", "kept"):
            channel.queue_declare(queue, durable=True)
        for i in range(0, 70, 7):  # message store bodies
            channel.basic_publish("", "gone", body(i), properties(i))
            channel.basic_publish("", "kept", body(i), properties(i))
        channel.queue_delete("gone")
    clean_stop(first)
    # "kept"'s index (an empty queue has no files, "gone" is gone) and the store (of each shard)
    assert queue_and_store_summaries(first.data_dir) == (1, len(shard_dirs(first.data_dir)))
    written = len(summaries(first.data_dir))
    second = start(tmp_path, brokers, first.data_dir)
    assert second.log.count(SUMMARY_USED) == written, second.log
    assert "recovery summary not used" not in second.log
    with connect(second.port) as connection:
        channel = connection.channel()
        assert channel.queue_declare("empty", passive=True).method.message_count == 0
        got = [channel.basic_get("kept", auto_ack=True) for _ in range(10)]
        assert [b for _m, _p, b in got] == [body(i) for i in range(0, 70, 7)]
        assert channel.basic_get("kept") == (None, None, None)
