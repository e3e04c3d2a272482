"""The node's one dead-letter log on a node of several shards (docs/scaling.md,
docs/analytics.md "On a node of several shards"): shard 0 keeps it; a shard
that kept dead letters itself (hutch before) hands them over at its start;
a message dead-lettered on shard 1 leaves its queue only once shard 0 has
its record on disk, so a SIGKILLed shard 1 loses no record. Real `--shards 2`
brokers, pika clients, the management API (the listing's shapes, paging
and hutchctl are in tests/test_shards_management.py).
"""
from __future__ import annotations

import asyncio
import glob
import os
import signal

import pika

from helpers import wait_for
from http_api import Api
from storage.dead_letter_log import DeadLetter, DeadLetterLog, DeadLetterLogSettings
from storage.writer import GroupCommitWriter
from shard_kit import on_shard, queue_on
from shard_kit import pid_of_shard as _pid_of_shard

SHARDS = ("--shards", "2", "--shard-moves", "false")


def records(api, start: int = 0) -> list:
    reply = api.get("/api/hutch/dead-letters/%%2F?start=%d&limit=10000" % start)
    assert reply.status == 200, reply
    return reply.body["records"]


async def _write_log(directory: str, message_ids: list[str]) -> None:
    """A dead-letter log as hutch wrote it in a shard's own data directory
    before shard 0 kept the node's (the storage's own writer and format)."""
    writer = GroupCommitWriter(asyncio.get_running_loop())
    try:
        log = DeadLetterLog(directory, writer, DeadLetterLogSettings())
        log.recover()
        loop = asyncio.get_running_loop()
        written = []
        for message_id in message_ids:
            done = loop.create_future()
            log.append(DeadLetter(time=1795358884.0, vhost="/", queue="kept-on-1", reason="expired", exchange="",
                                  routing_keys=["kept-on-1"], message_id=message_id, body_size=2, body=b"hi"),
                       lambda done=done: done.set_result(None))
            written.append(done)
        await asyncio.gather(*written)
        log.close()
    finally:
        writer.stop()


def test_dead_letters_a_shard_kept_itself_go_to_shard_0s_log(tmp_path, start_broker):
    data = tmp_path / "node"
    start_broker(*SHARDS, "--data-dir", str(data), expect=("AMQP", "HTTP")).stop()
    [vhost_dir] = glob.glob(str(data / "shards" / "1" / "vhosts" / "*"))
    kept = os.path.join(vhost_dir, "dead_letters")
    asyncio.run(_write_log(kept, ["old-1", "old-2"]))
    node = start_broker(*SHARDS, "--data-dir", str(data), expect=("AMQP", "HTTP"))
    api = Api(node.ports["HTTP"])
    wait_for(lambda: [(r["queue"], r["reason"], r["properties"]["message_id"]) for r in records(api)]
             == [("kept-on-1", "expired", "old-1"), ("kept-on-1", "expired", "old-2")],
             timeout=10, what="shard 1's records in the node's log")
    assert records(api)[0]["time"] == 1795358884.0  # when it died, not when it moved
    wait_for(lambda: not os.path.exists(kept), timeout=10, what="shard 1's own log deleted once moved")
    node.stop()
    again = start_broker(*SHARDS, "--data-dir", str(data), expect=("AMQP", "HTTP"))  # moved once only
    assert [r["properties"]["message_id"] for r in records(Api(again.ports["HTTP"]))] == ["old-1", "old-2"]


def test_a_shard_killed_while_dead_lettering_loses_no_record(start_broker):
    node = start_broker(*SHARDS, expect=("AMQP", "HTTP"))
    api = Api(node.ports["HTTP"])
    owner = on_shard(node.port, 1)
    channel = owner.channel()
    name = queue_on(node, channel, 1)
    channel.confirm_delivery()
    count = 2000
    for i in range(count):
        channel.basic_publish("", name, b"%d" % i, pika.BasicProperties(delivery_mode=2, message_id=str(i)))
    delivered = []
    channel.basic_consume(name, lambda _ch, method, _props, _body: delivered.append(method.delivery_tag))
    wait_for(lambda: owner.process_data_events(0) or len(delivered) == count, timeout=20, what="every delivery")
    channel.basic_nack(delivered[-1], multiple=True, requeue=False)  # all of them die at once on shard 1
    # killed once shard 0 has the first records: anywhere from there to the last ack on shard 1
    wait_for(lambda: api.get("/api/hutch/dead-letters/%2F?limit=0").body["next_offset"] > 0, timeout=10,
             what="the first records")
    victim = _pid_of_shard(node, 1)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: _pid_of_shard(node, 1) not in (None, victim), 20, what="shard 1 started again")
    fresh = on_shard(node.port, 1).channel()  # its queues are recovered before it serves
    logged = {r["properties"]["message_id"] for r in records(api) if r["queue"] == name}
    kept = set()
    while True:
        method, props, _body = fresh.basic_get(name, auto_ack=True)
        if method is None:
            break
        kept.add(props.message_id)
    # every message is in its queue or in the node's log (or both: at least once)
    assert logged | kept == {str(i) for i in range(count)}, (len(logged), len(kept))
