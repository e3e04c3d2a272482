"""The history of a partition run (tests/partition_kit.py) and the checker
that judges it. Pure: no network, no processes (tests/test_partition_checker.py
feeds it made-up histories).

The history holds every client operation, stamped with the harness's
monotonic clock when the client saw it:

- `connect`  a client connection opened: `conn`, and `node`, the node that
             serves it (its Connection.Start's cluster_name: a follower
             forwards the leader's bytes, so this is the leader it reached)
- `send`     a persistent publish sent (`number`)
- `confirm`  its basic.ack arrived; `nack` its basic.nack; `unknown` the
             connection ended before either (it may or may not be there)
- `deliver`  a delivery (`number`, `redelivered`)
- `ack`      a basic.ack sent for a delivery
- `settle`   a synchronous reply (basic.qos-ok) on the consumer's channel:
             every ack that channel sent before it has been handled by the broker
- `cut`      the harness cut the client's path to host `node`; `mend` it healed it

and the terms seen in etcd, polled from one thread: a term is a leader key
(the leader, and the key's create revision: every election creates the key
anew), or its absence. For each, `seen` is when the first poll
that saw it ended, `last` when the last poll that saw it started, and
`not_before` when the last poll that saw the term before it started: the
term held during all of [seen, last], and began after `not_before`.

The rules (`check`):

1. No confirmed message lost: every confirmed number is delivered by the
   end (the harness drains the queues after healing; the consumer acks each
   delivery, and an ack whose settling reply was lost with its connection
   may or may not have been handled, so delivery is what counts).
2. No acked message back: a delivery of a number whose ack was settled
   before is allowed only if it has redelivered=true and a new term may have
   begun between the settled ack and the delivery (the settling reply judged
   at the earliest time it can have been sent, as confirms in rule 4: a
   qos-ok the leader sent in its term just before a cut of the client's path
   arrives after the healing, in the next term). That is what
   docs/cluster.md promises: acks do not wait for the followers, so after a
   failover an acked message may come back, flagged, as after a crash;
   without a failover it must never come back.
3. A message delivered again always has redelivered=true (AMQP: a message
   delivered before and requeued, also by a failover, is flagged).
4. At most one node confirms per term: a confirm that arrives while a term
   certainly holds (within its [seen, last]) must come from that term's
   leader. A stale leader's confirm is caught that way: etcd showed no
   leader, or another one, before the confirm arrived and after it. A
   confirm held up in the network is judged at the earliest time it can
   have been sent: when the harness cut the path it arrived by (the
   `via` host's, `cut`), if it arrives during that cut or within the
   cut's length plus a second after the `mend` (TCP retransmits with a
   backoff that at most doubles the time waited so far). Without that, a
   leader's confirm sent in its term, just before the leader was isolated
   from everyone, the client included, and retransmitted after the
   healing, would count as the next term's.
5. Every node in sync again after healing: recorded by the harness per
   fault (`Fault.in_sync_after`), not from the history.
"""
from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Op:
    t: float
    kind: str
    conn: int = 0
    number: int | None = None
    redelivered: bool = False
    node: str | None = None
    via: str | None = None  # connect: the node dialed (which forwards to `node` when it follows)


@dataclass
class Term:
    seen: float  # when the first poll that saw it ended
    last: float  # when the last poll that saw it started
    not_before: float  # when the last poll that saw the term before it started
    leader: str | None  # None: no leader key
    term: int | None  # the leader key's create revision (one per election)


class History:
    """Thread-safe append-only history."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.terms: list[Term] = []
        self._lock = threading.Lock()
        self._next_conn = 0

    def record(self, kind: str, **fields) -> Op:
        op = Op(time.monotonic(), kind, **fields)
        self.ops.append(op)  # list.append is atomic under the GIL
        return op

    def connection(self, node: str | None, via: str | None = None) -> int:
        with self._lock:
            self._next_conn += 1
            conn = self._next_conn
        self.record("connect", conn=conn, node=node, via=via)
        return conn

    def term_seen(self, leader: str | None, term: int | None, started: float) -> None:
        """A poll that started at `started` (and ends now) saw this."""
        last = self.terms[-1] if self.terms else None
        if last is not None and (last.leader, last.term) == (leader, term):
            last.last = started
        else:
            self.terms.append(Term(time.monotonic(), started, last.last if last else 0.0, leader, term))

    def confirmed(self) -> set[int]:
        return {op.number for op in self.ops if op.kind == "confirm"}

    def confirms_since(self, start: float) -> list[Op]:
        sent_after = {op.number for op in self.ops if op.kind == "send" and op.t >= start}
        return [op for op in self.ops if op.kind == "confirm" and op.number in sent_after]

    def longest_gap(self, start: float, end: float, above: int = 0) -> float:
        """The longest time within [start, end] without a confirm (of a
        number above `above`) arriving."""
        times = [start] + sorted(op.t for op in self.ops if op.kind == "confirm" and op.number > above
                                 and start < op.t < end) + [end]
        return max(b - a for a, b in zip(times, times[1:]))

    def delivered(self) -> set[int]:
        return {op.number for op in self.ops if op.kind == "deliver"}


def _cuts(ops: list[Op]) -> dict[str, list[tuple[float, float]]]:
    """host -> the intervals its path to the client was cut (one still cut at the end lasts forever)."""
    cuts: dict[str, list[tuple[float, float]]] = {}
    began: dict[str, float] = {}
    for op in ops:
        if op.kind == "cut":
            began.setdefault(op.node, op.t)
        elif op.kind == "mend" and op.node in began:
            cuts.setdefault(op.node, []).append((began.pop(op.node), op.t))
    for host, start in began.items():
        cuts.setdefault(host, []).append((start, float("inf")))
    return cuts


def _settled(ops: list[Op], sent_no_earlier) -> dict[int, tuple[float, float]]:
    """number -> (the earliest time the broker can have handled its first
    settled ack, and when the settling reply arrived)."""
    pending: dict[int, list[int]] = {}
    settled: dict[int, tuple[float, float]] = {}
    for op in ops:
        if op.kind == "ack":
            pending.setdefault(op.conn, []).append(op.number)
        elif op.kind == "settle":
            for number in pending.pop(op.conn, []):
                settled.setdefault(number, (sent_no_earlier(op), op.t))
    return settled


@dataclass
class Verdict:
    published: int = 0
    confirmed: int = 0
    nacked: int = 0
    unknown: int = 0
    delivered: int = 0
    lost: list = field(default_factory=list)
    acked_back_allowed: int = 0  # flagged, after a failover (rule 2)
    acked_back: list = field(default_factory=list)  # violations of rule 2
    unflagged_redeliveries: list = field(default_factory=list)  # rule 3
    foreign_confirms: list = field(default_factory=list)  # rule 4
    terms: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.acked_back or self.unflagged_redeliveries or self.foreign_confirms)

    def problems(self) -> list[str]:
        said = []
        if self.lost:
            said.append("%d confirmed messages lost, e.g. %s" % (len(self.lost), self.lost[:10]))
        if self.acked_back:
            said.append("%d acked messages delivered again against rule 2, e.g. %s" % (
                len(self.acked_back), self.acked_back[:5]))
        if self.unflagged_redeliveries:
            said.append("%d messages delivered again without redelivered=true, e.g. %s" % (
                len(self.unflagged_redeliveries), self.unflagged_redeliveries[:10]))
        if self.foreign_confirms:
            said.append("%d confirms from a node that did not lead the term, e.g. %s" % (
                len(self.foreign_confirms), self.foreign_confirms[:5]))
        return said


def check(ops: list[Op], terms: list[Term]) -> Verdict:
    ops = sorted(ops, key=lambda op: op.t)
    verdict = Verdict(terms=len({(t.leader, t.term) for t in terms if t.leader is not None}))
    node_of = {op.conn: op.node for op in ops if op.kind == "connect"}
    node_via = {op.conn: op.via or op.node for op in ops if op.kind == "connect"}
    starts = [term.seen for term in terms]
    new_leaders = [term for term in terms if term.leader is not None]

    def term_at(t: float) -> Term | None:
        """The term that certainly held at `t`, if one did."""
        index = bisect.bisect_right(starts, t) - 1
        return terms[index] if index >= 0 and t <= terms[index].last else None

    def failover_between(a: float, b: float) -> bool:
        """Whether a term with a leader may have begun after `a`, before `b`."""
        return any(term.not_before < b and term.seen > a for term in new_leaders)

    cuts = _cuts(ops)

    def sent_no_earlier(op: Op) -> float:
        """The earliest time `op` (a reply that arrived at op.t) can have been sent."""
        for start, end in cuts.get(node_via.get(op.conn), ()):
            if start <= op.t <= end + (end - start) + 1.0:
                return start
        return op.t

    settled = _settled(ops, sent_no_earlier)
    delivered: set[int] = set()
    for op in ops:
        kind = op.kind
        if kind == "send":
            verdict.published += 1
        elif kind == "confirm":
            verdict.confirmed += 1
            term = term_at(sent_no_earlier(op))
            node = node_of.get(op.conn)
            if term is not None and term.leader != node:
                verdict.foreign_confirms.append((op.number, node, term.leader, term.term, op.t))
        elif kind == "nack":
            verdict.nacked += 1
        elif kind == "unknown":
            verdict.unknown += 1
        elif kind == "deliver":
            verdict.delivered += 1
            number = op.number
            if number in delivered and not op.redelivered:
                verdict.unflagged_redeliveries.append(number)
            handled, acked_at = settled.get(number, (None, None))
            if acked_at is not None and acked_at < op.t:
                if op.redelivered and failover_between(handled, op.t):
                    verdict.acked_back_allowed += 1
                else:
                    verdict.acked_back.append((number, op.redelivered))
            delivered.add(number)
    verdict.lost = sorted({op.number for op in ops if op.kind == "confirm"} - delivered)
    return verdict
