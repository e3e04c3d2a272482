"""A client connection as every face's listener holds it.

`ClientProtocol` is the only class that touches a transport (asyncio.BufferedProtocol <->
a face's connection); `ClientConnection` is the base of those connections: their name, and the
credit flow and alarm state the vhosts' publisher port and the management API see.

Writes are batched: the connection appends frames and calls `wake`, and one
`call_soon` per loop turn writes everything with a single `writelines`.

Acks before replies: when the client's acks were handled since the last
write (`acks_handled`), the write waits until the disk writer has
handed every record queued so far -- the acks' among them -- to the OS
(`GroupCommitWriter.when_written`; no fsync). On a node of several shards
an ack of another shard's queue is written by that shard: the write also
waits until every owner acked to says it has written them
(`ShardNode.when_acks_written`). A client that sees any later frame on this
connection thus knows its acks survive a crash of the broker process
(docs/storage.md, "Acks").

Fencing: a cluster leader whose etcd lease may have run out (`broker.promising`
false, amqp_server.cluster.lease) writes nothing to its clients, not only no
confirm: a leader frozen past its lease (SIGSTOP, a stalled VM) wakes with
deliveries to make and acks to answer, and a consumer that saw its ack
answered (any later frame) would take it as done while the new leader, which
never heard of it, delivers the message again. The cluster node wakes every
connection when etcd answers that the lease is alive after all; if it is
gone, the node stops and the held output goes with the connections.

Reads land in one buffer shared by every connection: asyncio asks for it,
fills it and hands it over in one synchronous step (get_buffer, recv_into,
buffer_updated), and the connection's reader copies what it keeps before
returning. With a plain Protocol every read would allocate a 256 KiB bytes
object and shrink it to the bytes received; glibc serves those from its heap
(once its dynamic mmap threshold has risen) and the shrunk remnants fragment
it: the broker's RSS grew by about 100 bytes per short-lived connection while
the memory in use stayed flat (docs/benchmarks.md, "Fuzz soak").
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amqp_server.shared.alarms import ResourceAlarms
    from amqp_server.shared.config import BrokerConfig
    from amqp_server.shared.login_throttle import LoginThrottle
    from storage.writer import GroupCommitWriter
    from vhosts import Broker

READ_SIZE = 256 * 1024  # asyncio's own read size
_read_buffer = memoryview(bytearray(READ_SIZE))
# A connection's last state, whatever the face: the socket is gone.
CLOSED = "closed"
# Input handled per loop turn, so one busy connection cannot starve the others: then reading
# pauses until the next turn.
INPUT_BUDGET = 128 * 1024


class ClientConnection:
    """What every face's connection shares. A subclass has `io` (its
    ClientProtocol), `peer`, `state`, `alarms`, `blocked_by` (the flow
    sources holding its reading) and `parse()` (handle what is buffered)."""

    @property
    def name(self) -> str:
        """RabbitMQ's connection name, "peer_host:peer_port -> host:port"."""
        peer = self.peer or ("", 0)
        transport = self.io.transport
        local = (transport.get_extra_info("sockname") if transport is not None else None) or ("", 0)
        return "%s:%d -> %s:%d" % (peer[0], peer[1], local[0], local[1])

    # -- input ----------------------------------------------------------------------

    # A state in which input is dropped unread besides CLOSED (MQTT's refused login).
    deaf = CLOSED

    def received(self, data) -> None:
        """`data` is valid during this call only (a view of the shared read
        buffer): the face's `reader` copies what it keeps. `_heard` tells the
        face's heartbeat check that the client is alive."""
        if self.state is CLOSED or self.state is self.deaf:
            return
        self._heard = True
        self.recv_oct += len(data)
        self.recv_cnt += 1
        self.reader.feed(data)
        self.parse()

    # -- flow control: the publisher port of vhosts ------------------------------

    def throttled_by(self, source) -> None:
        self.blocked_by.add(source)

    def unblocked(self, source) -> None:
        self.blocked_by.discard(source)
        if not self.blocked_by and self.state is not CLOSED:
            self.io.call_soon(self._continue)

    @property
    def flow_state(self) -> str:
        """RabbitMQ's `state`: blocked (published during an alarm), blocking
        (an alarm is raised but this connection has not published since),
        flow (credit flow holds its reading), else running."""
        if self.alarms in self.blocked_by:
            return "blocked"
        if self.alarms.raised:
            return "blocking"
        return "flow" if self.blocked_by else "running"

    def _continue(self) -> None:
        if self.state is CLOSED or self.blocked_by:
            return
        self.io.resume_reading()
        self.parse()


class ClientProtocol(asyncio.BufferedProtocol):
    """A listener's protocol; a face's subclass makes its connection in `connection_made`."""

    def __init__(self, broker: "Broker", config: "BrokerConfig", connections: set, alarms: "ResourceAlarms",
                 logins: "LoginThrottle", writer: "GroupCommitWriter") -> None:
        self.broker = broker
        self.writer = writer
        self.logins = logins
        self.config = config
        self.connections = connections
        self.alarms = alarms
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.connection: ClientConnection | None = None
        self._flush_scheduled = False
        self._closing = False  # close the transport once the output is written
        # After acks: how many of the writer's appends must be written before
        # anything more is (their records among them), else None.
        self._records: int | None = None
        # ... and how many acks sent to each other shard it has written (ShardNode.acks_mark), else None.
        self._remote_acks: dict | None = None
        self._forgotten = False  # its connection moved to another shard (`forget`)

    # -- asyncio.BufferedProtocol --------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        return _read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.connection.received(_read_buffer[:nbytes])

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self.connection)
        if not self._forgotten:
            self.connection.lost()

    def pause_writing(self) -> None:
        self.connection.socket_paused = True

    def resume_writing(self) -> None:
        self.connection.socket_paused = False
        self.connection.output_resumed()

    # -- what a ClientConnection asks of its IO --------------------------------------

    def wake(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        promising = self.broker.promising
        if promising is not None and not promising():
            return  # fencing (above): the cluster node wakes this connection if the lease holds
        connection = self.connection
        if connection.acks_handled:
            connection.acks_handled = False
            self._records = self.writer.submitted
            if self.broker.shards is not None:
                self._remote_acks = self.broker.shards.acks_mark()
        if self._records is not None:
            # Also when woken again meanwhile (a confirm on another channel).
            if not self.writer.when_written(self._records, self.wake):
                return
            self._records = None
        if self._remote_acks is not None:
            if not self.broker.shards.when_acks_written(self._remote_acks, self.wake):
                return
            self._remote_acks = None
        out = connection.take_output()
        if out:
            transport.writelines(out)
        if self._closing:
            transport.close()

    @property
    def records_held(self) -> bool:
        """Output waits for acks' records to reach the OS."""
        return self._records is not None or self._remote_acks is not None

    def flush_now(self) -> None:
        """Write what is pending at once, not at the end of the loop turn."""
        self._flush()

    def forget(self) -> None:
        """The connection moved to another shard with its socket (a copy of
        the descriptor): close ours without a word to the client."""
        self._forgotten = True
        self.connections.discard(self.connection)
        self.transport.abort()

    def close(self) -> None:
        """Write whatever is pending (after the acks' records), then close."""
        self._closing = True
        self._flush()

    def call_later(self, delay: float, callback) -> asyncio.TimerHandle:
        return self.loop.call_later(delay, callback)

    def call_soon(self, callback) -> None:
        self.loop.call_soon(callback)

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.transport.is_closing():
            self.transport.resume_reading()
