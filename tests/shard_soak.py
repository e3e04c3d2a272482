"""A shard fault soak (docs/scaling.md, "When a shard ends"): confirmed persistent
publishers and acking consumers on a queue of every shard of a running node,
while random shards are SIGKILLed or stopped (SIGSTOP, which the other shards
fence), and the history checker that judges the run. Used by
tests/test_shard_soak.py (seconds) and bench/shard_soak.py (minutes).

The rules (`check`): every confirmed message is delivered by the end; a
message acked is delivered again only after its queue's shard, or its
consumer's, restarted (and then flagged redelivered); each queue's first
deliveries keep its publisher's order."""
from __future__ import annotations

import dataclasses
import os
import random
import signal
import threading
import time

import pika

from shard_kit import on_shard, pid_of_shard, queue_on

PERSISTENT = pika.BasicProperties(delivery_mode=2)
# Seconds between a delivery leaving the broker and its client seeing it, at most (a local
# socket, but a client thread CI may starve for a while).
IN_FLIGHT = 2.0


@dataclasses.dataclass
class History:
    confirmed: dict = dataclasses.field(default_factory=dict)  # queue -> confirmed numbers
    deliveries: dict = dataclasses.field(default_factory=dict)  # queue -> [(time, number, redelivered)]
    faults: list = dataclasses.field(default_factory=list)  # (time, shard, kind, time it was back)
    errors: list = dataclasses.field(default_factory=list)  # client errors seen (reconnected)
    left: dict = dataclasses.field(default_factory=dict)  # queue -> messages in it after the drain


def _publish(node, queue: str, shard: int, history: History, stop: threading.Event) -> None:
    number = 0
    confirmed = history.confirmed.setdefault(queue, [])
    while not stop.is_set():
        try:
            connection = on_shard(node.port, shard)
            channel = connection.channel()
            channel.confirm_delivery()
            while not stop.is_set():
                number += 1
                channel.basic_publish("", queue, b"%d" % number, PERSISTENT)
                confirmed.append(number)
            connection.close()
        except Exception as exc:  # the shard ended under it, or a nack: not confirmed, go on
            history.errors.append(("publish", queue, repr(exc)[:200]))
            time.sleep(0.2)


def _consume(node, queue: str, shard: int, history: History, stop: threading.Event) -> None:
    seen = history.deliveries.setdefault(queue, [])
    while not stop.is_set():
        try:
            connection = on_shard(node.port, shard)
            channel = connection.channel()
            channel.basic_qos(prefetch_count=20)
            cancelled = []
            channel.add_on_cancel_callback(lambda _frame: cancelled.append(True))

            def delivered(ch, method, _props, body):
                seen.append((time.monotonic(), int(body), method.redelivered))
                ch.basic_ack(method.delivery_tag)

            channel.basic_consume(queue, delivered)
            while not stop.is_set() and not cancelled:
                connection.process_data_events(time_limit=0.2)
            connection.close()
        except Exception as exc:
            history.errors.append(("consume", queue, repr(exc)[:200]))
            time.sleep(0.2)


def _faults(node, shards: int, history: History, stop: threading.Event, every: float, rng: random.Random,
            first: int) -> None:
    while not stop.wait(every):
        shard = rng.randrange(first, shards)
        pid = pid_of_shard(node, shard, shards)
        if pid is None:
            continue
        kind = rng.choice(("kill", "stop"))
        began = time.monotonic()
        os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while pid_of_shard(node, shard, shards) in (None, pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        history.faults.append((began, shard, kind, time.monotonic()))
        try:
            os.kill(pid, signal.SIGCONT)  # a stopped shard was killed by the others; this is a no-op then
        except ProcessLookupError:
            pass


def run(node, shards: int, seconds: float, every: float, seed: int = 0,
        shard_0: bool = False) -> tuple[History, dict]:
    """The soak on a running `node` of `shards` shards: load on a queue of every shard for
    `seconds`, a fault every `every` seconds, then the queues drained; (history, queues' shards).
    Shard 0 is a target only with `shard_0` (its end restarts the node whole)."""
    rng = random.Random(seed)
    setup = on_shard(node.port, 0)
    owners = {queue_on(node, setup.channel(), shard, shards=shards): shard for shard in range(shards)}
    setup.close()
    history = History()
    loading, draining, faulting = threading.Event(), threading.Event(), threading.Event()
    threads = []
    for queue, owner in owners.items():
        # clients on another shard than the queue's: every record crosses a link
        client = (owner + 1) % shards
        threads.append(threading.Thread(target=_publish, args=(node, queue, client, history, loading)))
        threads.append(threading.Thread(target=_consume, args=(node, queue, client, history, draining)))
    threads.append(threading.Thread(target=_faults, args=(node, shards, history, faulting, every, rng,
                                                          0 if shard_0 else 1)))
    for thread in threads:
        thread.daemon = True
        thread.start()
    time.sleep(seconds)
    faulting.set()
    loading.set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _drained(history):
        time.sleep(0.5)
    time.sleep(1)  # redeliveries of what was being acked as the drain ended
    draining.set()
    for thread in threads:
        thread.join(30)
    with on_shard(node.port, 0) as connection:
        channel = connection.channel()
        history.left = {queue: channel.queue_declare(queue, passive=True).method.message_count for queue in owners}
    return history, owners


def _drained(history: History) -> bool:
    return all(set(numbers) <= {number for _t, number, _r in history.deliveries.get(queue, ())}
               for queue, numbers in history.confirmed.items())


def check(history: History, owners: dict) -> list[str]:
    """What the run broke (empty: nothing)."""
    problems = []
    for queue, numbers in history.confirmed.items():
        got = {number for _t, number, _r in history.deliveries.get(queue, ())}
        lost = sorted(set(numbers) - got)
        if lost:
            problems.append("%s: %d confirmed messages never delivered, first %s" % (queue, len(lost), lost[:5]))
    shards = len(owners)
    for queue, seen in history.deliveries.items():
        # the owner's end gives back what it had not seen acked; the client's shard's end loses
        # the acks it had not passed on (a connection's acks in flight, as on any broker);
        # shard 0's end restarts every shard
        involved = (0, owners[queue], (owners[queue] + 1) % shards)
        faults = [(began, back) for began, shard, _kind, back in history.faults if shard in involved]
        first_seen: dict = {}
        for when, number, redelivered in seen:
            if number not in first_seen:
                first_seen[number] = when
                continue
            # delivered again: its ack was lost with its owner, or it was never acked
            # a fault lasts until its shard is back (a stalled shard until it was fenced, shard 0's
            # until the node restarted); a delivery the client saw just after it began left
            # before it, and its ack met the fault
            restarted = any(began <= when and first_seen[number] - IN_FLIGHT <= back for began, back in faults)
            if not restarted:
                problems.append("%s: message %d delivered again at %.2f without a fault of its shard or its "
                                "consumer's" % (queue, number, when))
            elif not redelivered:
                problems.append("%s: message %d delivered again without the redelivered flag" % (queue, number))
        firsts = [number for _when, number, redelivered in seen if not redelivered]
        out_of_order = [(a, b) for a, b in zip(firsts, firsts[1:]) if b < a]
        if out_of_order:
            problems.append("%s: first deliveries out of order: %s" % (queue, out_of_order[:5]))
    return problems


def summary(history: History) -> dict:
    return {
        "confirmed": sum(len(numbers) for numbers in history.confirmed.values()),
        "delivered": sum(len(seen) for seen in history.deliveries.values()),
        "redelivered": sum(redelivered for seen in history.deliveries.values() for _t, _n, redelivered in seen),
        "faults": [(shard, kind) for _t, shard, kind, _back in history.faults],
        "client_errors": len(history.errors),
        "left": history.left,
    }
