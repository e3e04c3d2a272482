"""At-least-once dead-lettering, in-process on real storage: the source
queue's index keeps a dead-lettered persistent message until the durable
target's record of it went through a group commit (fsync). A SIGKILL cannot
tell this from merely writing the two records in order
(test_dead_letter_crash.py); a power loss could, and this test can.
"""
from __future__ import annotations

import asyncio
import struct

from pamqp import commands

from storage import Message
from storage.memory_monitor import MemoryMonitor
from storage.vhost_storage import StorageSettings, VhostStorage
from storage.writer import GroupCommitWriter
from vhosts.vhost import VirtualHost


class Publisher:
    def throttled_by(self, source) -> None:
        pass


async def test_the_source_acks_only_after_the_target_write_is_durable(tmp_path):
    writer = GroupCommitWriter(asyncio.get_running_loop(), "fsync")
    try:
        storage = VhostStorage(str(tmp_path), writer, MemoryMonitor(2**30), StorageSettings())
        vhost = VirtualHost("/", message_storage=storage)
        dead = vhost.declare_queue("dead", None, durable=True)
        source = vhost.declare_queue("src", None, durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
        header = struct.pack(">HHQ", 60, 0, 4) + commands.Basic.Properties(delivery_mode=2).marshal()
        confirmed = asyncio.Event()
        vhost.publish(Message("", "src", header, b"body"), ["src"], None, Publisher(), confirmed.set)
        await asyncio.wait_for(confirmed.wait(), 10)
        entry = source.get()
        index = source.backing.index
        source.reject([entry])
        # the dead letter is in the target, but its write is not durable yet: the source keeps it
        assert dead.message_count == 1 and source.message_count == 0
        assert index.is_live(entry.seq)
        await writer.drained()
        for _ in range(100):  # the durability callbacks run on the loop after the commit
            if not index.is_live(entry.seq):
                break
            await asyncio.sleep(0.01)
        assert not index.is_live(entry.seq)
    finally:
        writer.stop()
