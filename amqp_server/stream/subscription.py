"""One subscription: a stream-protocol consumer reading a stream queue's log
in chunks, under credit.

Theory of operation
- `next` is the next offset to read (-1 while a timestamp is being looked
  up, or while a single-active-consumer member waits to be told where to
  start). `pump` reads from the log on the reader thread when the
  subscription is active, has credit, is not reading already, the
  connection's socket takes more, and there are records at or past `next`.
- A read's records become chunks: runs of consecutive offsets that pass the
  filter, each run at most the negotiated frame size. Each chunk sent costs
  one credit (the protocol's credit counts chunks); a run left over for
  lack of credit is read again when credit comes (`next` goes back to it).
  Records are durable before they are readable (the log's invariant), so
  nothing delivered can vanish in a crash.
- Without a filter a read is in bulk: the raw bytes of about a frame's
  worth of records go, on the reader thread, through `stream_chunks` (the C
  twin of chunks.chunks_python when built) straight to Deliver frames, as
  many as the credit allows, with no Python step per record. It serves
  stream-protocol records as they are; where it stops at a record it cannot
  serve so (published over AMQP 0-9-1, or damaged), that read goes the
  general way: records decoded one by one (at most READ_RECORDS), converted,
  grouped into chunks.
- Filtering is exact (docs/streams.md): a record whose filter value the
  subscription does not want is never in a chunk; a client filtering again
  sees what RabbitMQ's Bloom filter would let through, minus false
  positives. Filtered subscriptions read the general way.
"""
from __future__ import annotations

from amqp_server.amqp.framing import C_TWINS
from amqp_server.stream import chunks
from vhosts.stream_records import amqp10_of, decode_filter, is_amqp10

READ_RECORDS = 256
READ_BYTES = 1024 * 1024

# The bulk step: the C twin when built (and of this layout), else its Python reference.
stream_chunks = chunks.chunks_python if C_TWINS is None else C_TWINS.stream_chunks


class Subscription:
    consumes = True  # counted among the stream's consumers (StreamQueue.consumer_count)
    __slots__ = ("connection", "id", "queue", "credit", "next", "reading", "filters", "unfiltered", "active",
                 "group", "properties", "requested", "delivered", "closed", "bulk")

    def __init__(self, connection, subscription_id: int, queue, credit: int, filters: frozenset | None,
                 unfiltered: bool, properties: dict) -> None:
        self.connection = connection
        self.id = subscription_id
        self.queue = queue
        self.credit = credit
        self.next = -1
        self.reading = False
        self.filters = filters  # None: every record
        self.unfiltered = unfiltered
        self.active = True
        self.group = None  # (vhost, stream, name) of its single-active-consumer group
        self.properties = properties
        self.requested = None  # the offset specification it subscribed with
        self.delivered = 0
        self.closed = False
        self.bulk = True  # read in bulk (no filter; the records ahead are stream-protocol ones)

    def wants(self, value: bytes) -> bool:
        if self.filters is None:
            return True
        return value in self.filters if value else self.unfiltered

    # -- starting ------------------------------------------------------------

    def start_at(self, offset: int) -> None:
        self.next = offset
        self.pump()

    # -- the queue's watcher interface --------------------------------------

    def records_available(self) -> None:
        self.pump()

    def stream_deleted(self, queue) -> None:
        self.connection.stream_gone(queue.name)

    # -- single active consumer ------------------------------------------------

    def activate(self) -> None:
        self.connection.consumer_update(self, True)

    def deactivate(self) -> None:
        self.active = False
        self.connection.consumer_update(self, False)

    # -- reading ---------------------------------------------------------------

    def pump(self) -> None:
        if (self.closed or not self.active or self.reading or self.credit <= 0 or self.next < 0
                or self.connection.output_blocked()):
            return
        log = self.queue.log
        if self.next < log.first_offset:
            self.next = log.first_offset  # retention went past it
        if self.next >= log.next_offset:
            return
        self.reading = True
        if self.filters is None and self.bulk:
            self._read_bulk()
        else:
            log.read(self.next, READ_RECORDS, self._records, READ_BYTES)

    def _read_bulk(self) -> None:
        start, credit, sub_id = self.next, self.credit, self.id
        max_bytes = self.connection.chunk_bytes()
        versioned = self.connection.deliver_version >= 2

        def chunked(data: bytes, limit: int):  # on the reader thread
            return stream_chunks(data, start, limit, sub_id, limit - 1 if versioned else -1, max_bytes, credit)
        # About a frame's worth of records (at most READ_BYTES of them: a frame max of 0 means none)
        self.queue.log.read_raw(start, min(max_bytes, READ_BYTES) + chunks.HEADER_BYTES, chunked, self._chunks)

    def _chunks(self, found) -> None:
        self.reading = False
        if self.closed:
            return
        if isinstance(found, Exception):
            return  # logged by the reader; the next batch tries again
        frames, following, stop = found
        for frame, first, count in frames:
            if self.credit <= 0 or not self.active:
                following = first
                break
            self.credit -= 1
            self.delivered += count
            self.connection.send(frame)
        self.next = following
        if stop in (chunks.STOP_OTHER, chunks.STOP_DAMAGED) or (stop == chunks.STOP_END and not frames):
            # Records to convert, damage to skip (and log), a gap between
            # segments: the general way, from here (and on, while the
            # records it reads were published over AMQP 0-9-1).
            self.bulk = stop != chunks.STOP_OTHER or bool(frames)
            if not self.closed and self.active and self.credit > 0 and self.next < self.queue.log.next_offset:
                self.reading = True
                self.queue.log.read(self.next, READ_RECORDS, self._records, READ_BYTES)
            return
        self.pump()

    def _records(self, found) -> None:
        self.reading = False
        if self.closed:
            return
        if isinstance(found, Exception):
            return  # logged by the reader; the next batch tries again
        if not found:
            if self.next < self.queue.log.first_offset:
                self.next = self.queue.log.first_offset
                self.pump()
            return
        limit = self.connection.chunk_bytes()
        runs: list[list] = []  # [first offset, timestamp, bodies, bytes]
        previous = -2
        for offset, stamp, payload in found:
            value, at = decode_filter(payload)
            if not self.wants(value):
                previous = -2
                continue
            body = amqp10_of(payload, at)
            run = runs[-1] if runs else None
            if (run is None or offset != previous + 1 or (run[3] + len(body) + 4 > limit and run[2])
                    or len(run[2]) == chunks.MAX_ENTRIES):
                run = [offset, stamp, [], 0]
                runs.append(run)
            run[2].append(body)
            run[3] += len(body) + 4
            previous = offset
        self.next = found[-1][0] + 1
        self.bulk = is_amqp10(found[-1][2])
        committed = self.queue.log.next_offset - 1
        for i, (first, stamp, bodies, _size) in enumerate(runs):
            if self.credit <= 0 or not self.active:
                self.next = first
                break
            self.credit -= 1
            self.delivered += len(bodies)
            self.connection.send(chunks.deliver_frame(
                self.id, first, stamp, bodies, committed if self.connection.deliver_version >= 2 else None))
        self.pump()
