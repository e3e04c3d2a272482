"""What a process killed between two writes of one group commit leaves on
disk: never a queue index record whose message body was not written.

In one batch a small message (embedded in its queue's index) followed by a
large one (body in the message store, then its index record) appends to the
index file first. The writer writes each file once per batch; here the
process "dies" right after the batch's first write (later writes are
dropped, as SIGKILL would drop them), and the data directory is recovered
as after a crash. The recovered queue must count only messages it can
serve (a count the consumer could never reach was what made
tests/test_torn_writes.py's kill -9 test wait for messages that were gone).
"""
from __future__ import annotations

import asyncio
import logging

from pamqp import commands, header

from storage.memory_monitor import MemoryMonitor
from storage.message import Message
from storage.vhost_storage import StorageSettings, VhostStorage
from storage.writer import AppendFile, GroupCommitWriter

EMBED = 256  # a body this small lives in the queue index


def message(size: int) -> Message:
    body = b"x" * size
    return Message("", "q", header.ContentHeader(0, size, commands.Basic.Properties(delivery_mode=2)).marshal(), body)


def storage(directory, writer, unclean_start: bool = False) -> VhostStorage:
    return VhostStorage(str(directory), writer, MemoryMonitor(10 ** 9),
                        StorageSettings(1 << 20, EMBED, 64, unclean_start=unclean_start))


async def test_a_batch_cut_after_its_first_write_leaves_no_record_without_its_body(tmp_path, monkeypatch, caplog):
    loop = asyncio.get_running_loop()
    writer = GroupCommitWriter(loop, "flush")
    first = storage(tmp_path, writer)
    first.finish_recovery()
    queue = first.new_queue("q", durable=True)
    warmed = loop.create_future()
    queue.publish(message(4000), lambda: warmed.set_result(None))  # the store's file exists from here on
    await asyncio.wait_for(warmed, 30)

    written = []
    write = AppendFile._write

    def killed_after_the_first_write(self, data: bytes) -> None:
        if not written:
            write(self, data)
        written.append(self.path)

    monkeypatch.setattr(AppendFile, "_write", killed_after_the_first_write)
    queue.publish(message(10))  # embedded: appends to the index first
    queue.publish(message(4000))  # body to the store, then its index record
    done = loop.create_future()
    writer.run(lambda: None, done.set_result)
    await asyncio.wait_for(done, 30)
    writer.stop()
    monkeypatch.undo()
    assert len(written) == 2, written  # one write per file: the store's and the index's

    caplog.set_level(logging.INFO)
    again = storage(tmp_path, GroupCommitWriter(loop, "flush"), unclean_start=True)
    recovered = again.recover_queue("q")
    again.finish_recovery()
    assert "not found in the message store" not in caplog.text
    # the first write was the body, so neither new message is in the index: only the first one is back
    assert recovered.ready == 1
    again.writer.stop()
