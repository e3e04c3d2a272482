"""QoS 2 (exactly once) packet-id state of one MQTT session; beyond RabbitMQ,
whose plugin downgrades QoS 2 to 1.

Theory of operation (MQTT 3.1.1 4.3.3, "method B" on the receiving side):
- Inbound: a QoS 2 PUBLISH whose packet id is not in `received` is routed and
  its id recorded; one whose id is there (a resend) is not routed again.
  Either way it gets PUBREC. PUBREL removes the id and gets PUBCOMP.
- Outbound: a delivery at QoS 2 is recorded in `sent` (message id -> packet
  id) so a redelivery after a reconnect reuses its packet id (the client
  deduplicates by it); PUBREC moves the id, with its message id, to
  `released` (PUBREL sent) and then acks the queue entry; PUBCOMP forgets
  it. After a reconnect every id in `released` gets its PUBREL again.
- A persistent session writes each change to `storage.mqtt_store` on the
  storage writer thread, so the state outlives restarts; a clean session's
  state lives and dies with its connection.
- Invariants across a crash (persistent sessions): a QoS 2 PUBLISH leaves
  only once its (message id, packet id) is on disk, so a message redelivered
  after a restart goes out with the id the client already holds. PUBREC's
  move from `sent` to `released` is one transaction, on disk before PUBREL
  goes out and before the queue entry's ack, so a message whose ack did not
  reach the disk comes back with its id in `released` and is acked again
  instead of being sent (`was_released`): the client has it.
"""
from __future__ import annotations

import logging
from typing import Callable

from storage.mqtt_store import RECEIVED, RELEASED, SENT

log = logging.getLogger("hutch.mqtt")


class ExactlyOnce:
    __slots__ = ("vhost", "client_id", "received", "sent", "released", "store", "writer")

    def __init__(self, vhost: str, client_id: str, store=None, writer=None) -> None:
        self.vhost = vhost
        self.client_id = client_id
        self.received: set[int] = set()
        self.sent: dict[bytes, int] = {}
        self.released: dict[int, bytes] = {}  # packet id -> message id
        # Both None for a clean session: nothing is written.
        self.store = store
        self.writer = writer

    def restore(self, rows: list[tuple[str, int, bytes]]) -> None:
        for kind, pid, msg_id in rows:
            if kind == RECEIVED:
                self.received.add(pid)
            elif kind == SENT:
                self.sent[msg_id] = pid
            else:
                self.released[pid] = msg_id

    def in_use(self, pid: int) -> bool:
        """Whether an outbound packet id is still taken by a QoS 2 flow."""
        return pid in self.released or pid in self.sent.values()

    # -- inbound -------------------------------------------------------------------

    def receive(self, pid: int, done: Callable[[], None] | None) -> tuple[bool, bool]:
        """A QoS 2 PUBLISH: (whether it is new and must be routed, whether
        `done` will be called once the id is on disk)."""
        if pid in self.received:
            return False, False
        self.received.add(pid)
        return True, self._write("add_packet_id", RECEIVED, pid, b"", done)

    def release(self, pid: int) -> None:
        if pid in self.received:
            self.received.discard(pid)
            self._write("remove_packet_id", RECEIVED, pid)

    # -- outbound ------------------------------------------------------------------

    def sent_before(self, msg_id: bytes) -> int | None:
        return self.sent.get(msg_id)

    def was_released(self, msg_id: bytes) -> bool:
        """Whether the client already PUBRECed this message (it came back
        because its ack had not reached the disk before a crash)."""
        return msg_id in self.released.values()

    def record_sent(self, msg_id: bytes, pid: int, done: Callable[[], None]) -> bool:
        """A new outbound QoS 2 delivery; True when `done` will be called
        once it is on disk (the PUBLISH must wait for that)."""
        self.sent[msg_id] = pid
        return self._write("add_packet_id", SENT, pid, msg_id, done)

    def record_pubrec(self, msg_id: bytes, pid: int, done: Callable[[], None]) -> bool:
        """PUBREC of a delivery; True when `done` will be called once that is
        on disk (PUBREL must wait for it: a client that got PUBREL forgets
        the id, so a PUBLISH sent again after a crash would be new to it)."""
        self.sent.pop(msg_id, None)
        self.released[pid] = msg_id
        return self._write("release_packet_id", RELEASED, pid, msg_id, done)

    def complete(self, pid: int) -> None:
        if self.released.pop(pid, None) is not None:
            self._write("remove_packet_id", RELEASED, pid)

    def forget(self) -> None:
        """The session ends (clean session): all of its state goes."""
        self.received.clear()
        self.sent.clear()
        self.released.clear()
        store = self.store
        if store is not None:
            vhost, client_id = self.vhost, self.client_id
            self.writer.run(lambda: store.forget_session(vhost, client_id))

    def _write(self, operation: str, kind: str, pid: int, msg_id: bytes = b"",
               done: Callable[[], None] | None = None) -> bool:
        store = self.store
        if store is None:
            return False
        vhost, client_id = self.vhost, self.client_id
        if operation == "add_packet_id":
            job = lambda: store.add_packet_id(vhost, client_id, kind, pid, msg_id)  # noqa: E731
        elif operation == "release_packet_id":
            job = lambda: store.release_packet_id(vhost, client_id, pid, msg_id)  # noqa: E731
        else:
            job = lambda: store.remove_packet_id(vhost, client_id, kind, pid)  # noqa: E731
        if done is None:
            self.writer.run(job)
            return False

        def written(result) -> None:
            # A failed write still lets the packet go (holding it would stall
            # the session for good), but exactly-once across a crash is then lost.
            if isinstance(result, BaseException):
                log.error("QoS 2 state of MQTT client id %s not written (%s %s): %s",
                          client_id, operation, pid, result)
            done()

        self.writer.run(job, written)
        return True
