"""A stream queue: an append-only log that every consumer reads on its own
(RabbitMQ 3.10's stream queues over AMQP 0-9-1; docs/streams.md).

It offers the interface of `vhosts.queue.Queue` that the channel, the vhost
and the management API use, so none of them asks what type a queue is; what
a stream does not do it answers as RabbitMQ does (basic.get, nack/reject,
purge: 540 NOT_IMPLEMENTED).

Theory of operation
- `publish` appends the message (`Message.to_bytes`) to the queue's
  `storage.stream_log.StreamLog`; the publisher's `on_durable` (its confirm)
  runs once the record is on disk, whatever the message's delivery mode.
- Each consumer has a `_Reader`: the next offset it will read and a buffer
  of entries read from the log. `dispatch` delivers from each buffer while
  the consumer's channel can take more (basic.qos prefetch is the credit:
  an ack frees it and removes nothing), and refills an empty buffer with one
  log read on the reader thread (READ_RECORDS records or READ_BYTES bytes at
  most, so RAM per consumer is bounded however long the stream). Records
  become readable once durable (the log's invariant 2), and each durable
  batch wakes the readers once (`_wake`, one loop callback per turn).
- A delivered entry's message carries an `x-stream-offset` header (long)
  with its offset; the entry's seq is the offset.
- Where a consumer starts (x-stream-offset): first, last (the newest
  record: hutch's chunk is one record), next (default: the first offset not
  yet written), an offset (below the first kept one: the first kept one;
  beyond the end: that offset once written, as RabbitMQ 3.10-4.x deliver
  over AMQP 0-9-1), or a time (a timestamp or an interval such as "1h": the first record
  appended at or after it, looked up on the reader thread).
- Records (vhosts.stream_records) hold AMQP 0-9-1 or stream-protocol
  (AMQP 1.0) messages; a consumer here gets either as AMQP 0-9-1.
- Filtering (RabbitMQ 3.13): a publish's `x-stream-filter-value` header is
  stored at the head of its record; a consumer with `x-stream-filter` (one
  value or a list) gets exactly the records with one of those values, plus
  the records without a value when `x-stream-match-unfiltered` is true
  (the arguments read as RabbitMQ reads them: stream_arguments.filters_of).
  RabbitMQ skips whole chunks by a Bloom filter and may deliver records
  that do not match (its clients filter again); hutch's filter is exact and
  decodes no message it skips, which a client filtering again cannot tell
  from RabbitMQ's.
- Retention (x-max-length-bytes, x-max-age, x-stream-max-segment-size-bytes
  and their policies) is the log's; a policy change applies at once.
  A reader left behind by retention continues at the first kept offset.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

from storage import Message, QueueEntry
from storage.message import encode_value
from vhosts.stream_records import decode_filter, encode, message_of
from storage.stream_log import StreamLog
from vhosts.clock import Clock, LoopClock
from vhosts.consumer import Consumer
from vhosts.queue import ACCEPTED, DURABLE_PENDING
from vhosts.queue_arguments import NO_SETTINGS
from vhosts.stats import MessageStats
from vhosts.stream_arguments import (FIRST, LAST, NEXT, OFFSET, check_consume, filters_of, not_supported,
                                     retention, start_of)

READ_RECORDS = 256
READ_BYTES = 1024 * 1024


class _Reader:
    """One consumer's place in the stream."""

    __slots__ = ("consumer", "next", "buffer", "reading", "filters", "unfiltered")

    def __init__(self, consumer: Consumer, filters: frozenset[bytes] | None, unfiltered: bool) -> None:
        self.consumer = consumer
        self.next = -1  # -1: where to start is being looked up
        self.buffer: deque[QueueEntry] = deque()
        self.reading = False
        self.filters = filters  # None: every record
        self.unfiltered = unfiltered  # with filters: also the records without a filter value

    def wants(self, value: bytes) -> bool:
        if self.filters is None:
            return True
        return value in self.filters if value else self.unfiltered


class StreamQueue:
    remote = False  # this shard owns it (vhosts.remote_queue.RemoteQueue: another does)
    __slots__ = ("name", "vhost", "durable", "arguments", "log", "consumers", "exclusive_consumer", "single_active",
                 "active", "had_consumers", "deleted", "flow_waiters", "policy", "stats", "clock", "_readers",
                 "_wake_armed", "watchers")

    kind = "stream"
    delete_ok_count = 0  # RabbitMQ 3.10's queue.delete-ok of a stream
    exclusive_owner = None
    auto_delete = False
    backed_up = False  # the writer's backlog paces its publishers (vhosts.vhost.publish)
    settings = NO_SETTINGS  # no TTL, length limit or dead-lettering of a classic queue applies

    def __init__(self, name: str, vhost: str, log: StreamLog, arguments: dict, clock: Clock | None = None,
                 policy: dict | None = None) -> None:
        self.name = name
        self.vhost = vhost
        self.durable = True
        self.arguments = arguments
        self.log = log
        self.consumers: deque[Consumer] = deque()
        self.exclusive_consumer = False  # as RabbitMQ 3.10, an exclusive consumer keeps no one off a stream
        self.single_active = False
        self.active = None
        self.had_consumers = False
        self.deleted = False
        self.flow_waiters: set = set()
        self.stats = MessageStats()
        self.clock = clock or LoopClock()
        self._readers: dict[Consumer, _Reader] = {}
        self._wake_armed = False
        # Readers beside AMQP consumers (the stream protocol's subscriptions,
        # publishers): `records_available()` after each durable batch,
        # `stream_deleted(queue)` when the stream goes.
        self.watchers: set = set()
        self.policy = None
        self.apply_policy(policy)

    # -- what the management API shows ----------------------------------------

    @property
    def message_count(self) -> int:
        return self.log.next_offset - self.log.first_offset

    @property
    def consumer_count(self) -> int:
        """AMQP consumers and the stream protocol's subscriptions."""
        return len(self.consumers) + sum(1 for w in self.watchers if w.consumes)

    @property
    def size(self) -> int:
        """Bytes of the stream's segments."""
        return self.log.size

    def state_counts(self) -> dict[str, int]:
        return {}

    def peek(self, count: int, done: Callable[[list[QueueEntry] | Exception], None]) -> None:
        """The first `count` records kept, as entries."""
        def entries(records: list | Exception) -> None:
            done(records if isinstance(records, Exception)
                 else [_entry(offset, payload, decode_filter(payload)[1]) for offset, _t, payload in records])
        self.log.read(self.log.first_offset, count, entries, READ_BYTES)

    def read_log(self, start: int, limit: int, done: Callable[[list | Exception], None], max_bytes: int) -> None:
        """Records from offset `start` (the first kept when lower) for
        readers outside AMQP (the management API's stream endpoint, Spark):
        `done` gets [(offset, timestamp in ms, Message)] on the loop."""
        def decoded(records: list | Exception) -> None:
            if isinstance(records, Exception):
                done(records)
                return
            done([(offset, stamp, message_of(payload, decode_filter(payload)[1]))
                  for offset, stamp, payload in records])
        self.log.read(start, limit, decoded, max_bytes)

    @property
    def first_offset(self) -> int:
        return self.log.first_offset

    @property
    def next_offset(self) -> int:
        return self.log.next_offset

    # -- publish ---------------------------------------------------------------

    def publish(self, message: Message, on_durable: Callable[[], None] | None = None) -> int:
        self.append(encode(message), on_durable)
        return DURABLE_PENDING if on_durable is not None else ACCEPTED

    def append(self, record: bytes, on_durable: Callable[[], None] | None = None) -> int:
        """Append a record (vhosts.stream_records); its offset."""
        self.stats.publish += 1
        return self.log.append(record, None, _Durable(self, on_durable))

    def append_batch(self, records: list[bytes], on_durable: Callable[[], None]) -> None:
        """Append records; `on_durable` runs once the last is on disk (the
        log makes records durable in order, so all of them are then)."""
        self.stats.publish += len(records)
        append, last = self.log.append, len(records) - 1
        for i, record in enumerate(records):
            append(record, None, _Durable(self, on_durable) if i == last else None)

    def append_run(self, count: int, size: int, encode, on_durable: Callable[[], None]) -> None:
        """Append `count` records encoded at once (StreamLog.append_run);
        `on_durable` runs once they are on disk."""
        self.stats.publish += count
        self.log.append_run(count, size, encode, _Durable(self, on_durable))

    def throttle(self, publisher) -> None:
        """Never asked: a stream is never `backed_up`."""

    def _durable(self) -> None:
        if (self._readers or self.watchers) and not self._wake_armed:
            self._wake_armed = True
            self.clock.call_later(0, self._wake)

    def _wake(self) -> None:
        self._wake_armed = False
        self.dispatch()
        for watcher in list(self.watchers):
            watcher.records_available()

    # -- consumers ---------------------------------------------------------------

    def accept_consumer(self, no_ack: bool, prefetch_count: int, exclusive: bool, arguments: dict) -> int:
        """Check a basic.consume (stream_arguments.check_consume); its priority (none)."""
        check_consume(self.name, self.vhost, no_ack, prefetch_count, arguments)
        return 0

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.had_consumers = True
        reader = self._readers[consumer] = _Reader(consumer, *filters_of(self.name, self.vhost, consumer.arguments))
        where, value = start_of(self.name, self.vhost, consumer.arguments, self.clock.now() / 1000)
        log = self.log
        if where == FIRST:
            reader.next = log.first_offset
        elif where == LAST:
            reader.next = max(log.next_offset - 1, log.first_offset)
        elif where == NEXT:
            reader.next = log.next_offset
        elif where == OFFSET:
            reader.next = max(value, log.first_offset)
        else:
            reader.reading = True
            log.find_time(value, lambda found: self._started(reader, found))
            return
        self.dispatch()

    def _started(self, reader: _Reader, found: int | Exception) -> None:
        reader.reading = False
        reader.next = self.log.first_offset if isinstance(found, Exception) else found
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> bool:
        """Never auto-deleted: False."""
        if self._readers.pop(consumer, None) is not None:
            self.consumers.remove(consumer)
        return False

    # -- dispatch ----------------------------------------------------------------

    def dispatch(self, now: int = 0) -> None:
        for reader in list(self._readers.values()):
            consumer = reader.consumer
            channel = consumer.channel
            buffer = reader.buffer
            while buffer and channel.can_deliver(consumer):
                channel.deliver(consumer, self, buffer.popleft())
            if not buffer and not reader.reading and 0 <= reader.next < self.log.next_offset:
                self._read(reader)

    def _read(self, reader: _Reader) -> None:
        reader.reading = True
        self.log.read(reader.next, READ_RECORDS, lambda records: self._records(reader, records), READ_BYTES)

    def _records(self, reader: _Reader, records: list | Exception) -> None:
        reader.reading = False
        if self._readers.get(reader.consumer) is not reader:
            return  # the consumer went meanwhile
        if isinstance(records, Exception):
            return  # logged by the reader; the next wake tries again
        if not records:
            # Retention dropped what it was to read: go on at the first kept record.
            if reader.next >= self.log.first_offset:
                return
            reader.next = self.log.first_offset
        else:
            wants, buffer = reader.wants, reader.buffer
            for offset, _timestamp, payload in records:
                value, at = decode_filter(payload)
                if wants(value):
                    buffer.append(_entry(offset, payload, at))
            reader.next = records[-1][0] + 1
        self.dispatch()

    # -- settlement: acks give credit (the channel counts it), nothing is removed --

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        pass

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        """A channel closing with deliveries outstanding: nothing to give back."""

    def reject(self, entries: list[QueueEntry]) -> None:
        """Discarding is forgetting: nothing to do."""

    def check_return(self) -> None:
        """A client's basic.nack or basic.reject: refused as RabbitMQ 3.10 does."""
        raise not_supported("basic.nack and basic.reject", self.name, self.vhost)

    def get(self) -> QueueEntry | None:
        raise not_supported("basic.get", self.name, self.vhost)

    def when_available(self, callback: Callable[[], None]) -> None:
        """Never asked: `get` refuses first."""

    def purge(self) -> int:
        raise not_supported("queue.purge", self.name, self.vhost)

    def touch(self) -> None:
        """No x-expires on a stream."""

    def release_waiters(self) -> None:
        """No publisher ever waits on a stream itself."""

    # -- policies and deletion ------------------------------------------------------

    def apply_policy(self, definition: dict | None) -> None:
        self.policy = definition
        self.log.configure(retention(self.arguments, definition))

    def delete(self) -> list[Consumer]:
        """Remove the log's files; returns the consumers to notify."""
        self.deleted = True
        self.log.delete()
        consumers = list(self.consumers)
        self.consumers.clear()
        self._readers.clear()
        watchers, self.watchers = list(self.watchers), set()
        for watcher in watchers:
            watcher.stream_deleted(self)
        return consumers


def _entry(offset: int, payload: bytes, at: int) -> QueueEntry:
    """A record as a delivery: its message with the x-stream-offset header."""
    message = message_of(payload, at)
    header = message.header_with({"x-stream-offset": encode_value(offset)})
    return QueueEntry(offset, Message(message.exchange, message.routing_key, header, message.body))


class _Durable:
    """The log's `on_durable` of one publish: the publisher's confirm, then
    the readers are woken."""

    __slots__ = ("queue", "then")

    def __init__(self, queue: StreamQueue, then: Callable[[], None] | None) -> None:
        self.queue = queue
        self.then = then

    def __call__(self) -> None:
        if self.then is not None:
            self.then()
        self.queue._durable()
