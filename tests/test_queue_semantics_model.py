"""Hypothesis model test: a small random topology (three queues with random
length limits, overflow modes, TTL 0 or none, delivery limits and dead-letter
targets; a direct exchange whose keys each lead to one queue or nowhere) and
a random sequence of publishes (some with expiration 0), gets, acks, rejects
and requeues, run against the broker with pika and against a pure model of
the semantics in docs/queue-semantics.md. After every step the ready counts
agree; at the end every queue's contents agree, in order, with their x-death
histories. (TTL 0 keeps time out of it: such a message is expired at once
when no consumer waits, and there are no consumers here.)
"""
from __future__ import annotations

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pika.exceptions import NackError

from helpers import connect, unique

QUEUES = 3
KEYS = 4


# -- the pure model ----------------------------------------------------------------


class Msg:
    def __init__(self, body: str, expiration0: bool) -> None:
        self.body = body
        self.expiration0 = expiration0
        self.deaths: list[list] = []  # [queue, reason, count], latest first
        self.returns = 0


class ModelQueue:
    def __init__(self, name: str, spec: dict) -> None:
        self.name = name
        self.spec = spec
        self.ready: list[tuple[int, Msg]] = []  # (seq, message), ascending seq
        self.seq = 0


class Model:
    def __init__(self, queues: list[ModelQueue], bindings: dict[str, str]) -> None:
        self.queues = {q.name: q for q in queues}
        self.bindings = bindings  # key -> queue name

    def route(self, exchange: str, key: str) -> ModelQueue | None:
        name = key if exchange == "" else self.bindings.get(key)
        return self.queues.get(name)

    def publish(self, q: ModelQueue, msg: Msg) -> bool:
        """Enqueue as vhosts.Queue.publish does; False when refused."""
        spec = q.spec
        limit = spec["max_length"]
        if limit is not None and spec["overflow"] != "drop-head" and len(q.ready) + 1 > limit:
            if spec["overflow"] == "reject-publish-dlx":
                self.die(q, msg, "maxlen")
            return False
        q.seq += 1
        entry = (q.seq, msg)
        q.ready.append(entry)
        if limit is not None and spec["overflow"] == "drop-head":
            while len(q.ready) > limit:
                self.die(q, q.ready.pop(0)[1], "maxlen")
        if (spec["ttl0"] or msg.expiration0) and entry in q.ready:
            q.ready.remove(entry)
            self.die(q, msg, "expired")
        return True

    def die(self, q: ModelQueue, msg: Msg, reason: str) -> None:
        dlx = q.spec["dlx"]
        if dlx is None:
            return
        exchange, key = dlx
        dead = Msg(msg.body, False)
        deaths = [list(d) for d in msg.deaths]
        for d in deaths:
            if d[0] == q.name and d[1] == reason:
                d[2] += 1
                deaths.remove(d)
                deaths.insert(0, d)
                break
        else:
            deaths.insert(0, [q.name, reason, 1])
        dead.deaths = deaths
        target = self.route(exchange, key)
        if target is None:
            return
        if reason != "rejected" and self.is_cycle(target.name, deaths):
            return
        self.publish(target, dead)

    @staticmethod
    def is_cycle(queue: str, deaths: list) -> bool:
        for name, reason, _count in deaths:
            if reason == "rejected":
                return False
            if name == queue:
                return True
        return False

    def get(self, q: ModelQueue) -> tuple | None:
        return q.ready.pop(0) if q.ready else None

    def requeue(self, q: ModelQueue, entry: tuple) -> None:
        msg = entry[1]
        msg.returns += 1
        limit = q.spec["delivery_limit"]
        if limit is not None and msg.returns > limit:
            self.die(q, msg, "delivery_limit")
        else:
            q.ready.append(entry)
            q.ready.sort(key=lambda e: e[0])
        spec = q.spec
        if spec["max_length"] is not None and spec["overflow"] == "drop-head":
            while len(q.ready) > spec["max_length"]:
                self.die(q, q.ready.pop(0)[1], "maxlen")


# -- strategies -----------------------------------------------------------------------

queue_specs = st.fixed_dictionaries({
    "max_length": st.one_of(st.none(), st.integers(0, 3)),
    "overflow": st.sampled_from(["drop-head", "reject-publish", "reject-publish-dlx"]),
    "ttl0": st.booleans(),
    "delivery_limit": st.one_of(st.none(), st.integers(0, 1)),
    # None, or (exchange, key): "" with a queue index, or "x" with a key index
    "dlx": st.one_of(st.none(), st.tuples(st.just(""), st.integers(0, QUEUES - 1)),
                     st.tuples(st.just("x"), st.integers(0, KEYS - 1))),
})
topologies = st.tuples(st.lists(queue_specs, min_size=QUEUES, max_size=QUEUES),
                       st.lists(st.one_of(st.none(), st.integers(0, QUEUES - 1)), min_size=KEYS, max_size=KEYS))
operations = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.sampled_from(["", "x"]), st.integers(0, max(QUEUES, KEYS) - 1),
              st.booleans()),
    st.tuples(st.just("get"), st.integers(0, QUEUES - 1)),
    st.tuples(st.sampled_from(["ack", "reject", "requeue"]), st.integers(0, 5)),
), min_size=1, max_size=40)


@pytest.fixture(scope="module")
def client(broker):
    connection = connect(broker.port)
    yield connection
    connection.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(topology=topologies, ops=operations)
def test_broker_matches_the_model(client, topology, ops):
    specs, keys = topology
    names = [unique("m%d" % i) for i in range(QUEUES)]
    key_names = [unique("k%d" % i) for i in range(KEYS)]
    channel = client.channel()
    channel.confirm_delivery()
    exchange = unique("x")
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    model_queues = []
    for name, spec in zip(names, specs):
        spec = dict(spec)
        arguments = {"x-overflow": spec["overflow"]}
        if spec["max_length"] is not None:
            arguments["x-max-length"] = spec["max_length"]
        if spec["ttl0"]:
            arguments["x-message-ttl"] = 0
        if spec["delivery_limit"] is not None:
            arguments["x-delivery-limit"] = spec["delivery_limit"]
        if spec["dlx"] is not None:
            kind, index = spec["dlx"]
            spec["dlx"] = ("", names[index]) if kind == "" else ("x", key_names[index])
            arguments["x-dead-letter-exchange"] = exchange if kind == "x" else ""
            arguments["x-dead-letter-routing-key"] = spec["dlx"][1]
        channel.queue_declare(name, exclusive=True, arguments=arguments)
        model_queues.append(ModelQueue(name, spec))
    bindings = {}
    for key, target in zip(key_names, keys):
        if target is not None:
            channel.queue_bind(names[target], exchange, key)
            bindings[key] = names[target]
    model = Model(model_queues, bindings)
    model.queues_by_exchange = {"": "", "x": exchange}
    unacked: list[tuple] = []  # (delivery tag, model queue, model entry)
    published = 0
    try:
        for op in ops:
            if op[0] == "publish":
                _, kind, index, expiration0 = op
                key = names[index % QUEUES] if kind == "" else key_names[index % KEYS]
                published += 1
                body = "p%d" % published
                msg = Msg(body, expiration0)
                target = model.route(kind, key)
                expected = True if target is None else model.publish(target, msg)
                try:
                    channel.basic_publish(exchange if kind == "x" else "", key, body.encode(),
                                          pika.BasicProperties(expiration="0" if expiration0 else None))
                    acked = True
                except NackError:
                    acked = False
                assert acked == expected, op
            elif op[0] == "get":
                q = model_queues[op[1]]
                entry = model.get(q)
                method, _props, body = channel.basic_get(q.name)
                if entry is None:
                    assert method is None, op
                else:
                    assert body.decode() == entry[1].body, op
                    unacked.append((method.delivery_tag, q, entry))
            elif unacked:
                tag, q, entry = unacked.pop(op[1] % len(unacked))
                if op[0] == "ack":
                    channel.basic_ack(tag)
                elif op[0] == "reject":
                    channel.basic_reject(tag, requeue=False)
                    model.die(q, entry[1], "rejected")
                else:
                    channel.basic_nack(tag, requeue=True)
                    model.requeue(q, entry)
            for q in model_queues:
                assert channel.queue_declare(q.name, passive=True).method.message_count == len(q.ready), (op, q.name)
        for tag, q, entry in unacked:
            channel.basic_ack(tag)
        for q in model_queues:
            got = []
            while True:
                method, props, body = channel.basic_get(q.name, auto_ack=True)
                if method is None:
                    break
                deaths = [[d["queue"], d["reason"], d["count"]] for d in (props.headers or {}).get("x-death", [])]
                got.append((body.decode(), deaths))
            assert got == [(m.body, m.deaths) for _seq, m in q.ready], q.name
    finally:
        for name in names:
            channel.queue_delete(name)
        channel.close()
