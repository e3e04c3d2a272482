"""The records a shard sends another on their links (docs/scaling.md):
`RECORDS` names every kind with its fields and their types, as a frame
decodes them (amqp_server.shards.codec), and `table` the part of ShardNode
that handles each kind. A record is a tuple when sent and a list when
read, its kind first, then its fields; Mesh.received checks it
(`Kinds.fault`: a known kind, its arity, each field's type, and where `Of`
says a list's items or a dict's values) before its handler is called with
the link it came on and its fields, and logs and skips one that does not
fit.
"""
from __future__ import annotations

from itertools import repeat

from storage.dead_letter_log import DeadLetter

NONE = type(None)
ANY = object  # read as it is by its handler: a report, a service's arguments or answer, an order's result


class Of:
    """A list whose items, or a dict whose values, are all of `types` (a type or a tuple of them)."""

    __slots__ = ("container", "types", "_each")

    def __init__(self, container: type, types) -> None:
        self.container = container
        self.types = types
        self._each = repeat(types)  # endless: shared by every check

    def items(self, value):
        return value.values() if self.container is dict else value

    def fits(self, value) -> bool:
        return all(map(isinstance, self.items(value), self._each))


def _name(types) -> str:
    if isinstance(types, Of):
        return "%s of %s" % (types.container.__name__, _name(types.types))
    if isinstance(types, tuple):
        return " or ".join(_name(one) for one in types)
    return "anything" if types is ANY else types.__name__


class Kinds:
    """Named kinds of lists or tuples (records, definition changes), each
    a str naming its kind, then its fields: `schema` maps a kind to its
    fields' names and types (a type, a tuple of them, or `Of`)."""

    def __init__(self, what: str, schema: dict[str, dict]) -> None:
        self.what = what
        self.schema = schema
        # kind -> (the types of the kind and its fields, in order; the places of the fields `Of` checks)
        self._shapes = {
            kind: ((str,) + tuple(t.container if isinstance(t, Of) else t for t in fields.values()),
                   tuple((at, t) for at, t in enumerate(fields.values(), 1) if isinstance(t, Of)))
            for kind, fields in schema.items()}

    def fault(self, value) -> str | None:
        """None if `value` is one of these kinds, each field of its type; else what is wrong with it."""
        try:
            types, items = self._shapes[value[0]]
        except (LookupError, TypeError):  # empty, not a sequence, or its first item names no kind
            return self._what_is_wrong(value)
        # The first type is str: a str or dict whose [0] happens to name a kind fails here.
        if len(value) == len(types) and all(map(isinstance, value, types)):
            for at, of in items:
                if not of.fits(value[at]):
                    break
            else:
                return None
        return self._what_is_wrong(value)

    def _what_is_wrong(self, value) -> str | None:
        if type(value) not in (list, tuple) or not value or type(value[0]) is not str:
            return "not a %s: %.80r" % (self.what, value)
        kind = value[0]
        fields = self.schema.get(kind)
        if fields is None:
            return "%.80r is no kind of %s" % (kind, self.what)
        if len(value) != len(fields) + 1:
            return "%r has %d fields, not %d" % (kind, len(value) - 1, len(fields))
        for (name, types), field in zip(fields.items(), value[1:]):
            of = types if isinstance(types, Of) else None
            if not isinstance(field, of.container if of else types):
                return "%r field %r is %s, not %s" % (kind, name, type(field).__name__, _name(types))
            if of is not None and not of.fits(field):
                wrong = next(item for item in of.items(field) if not isinstance(item, of.types))
                return "%r field %r holds %s, not %s" % (kind, name, type(wrong).__name__, _name(of.types))


# Every record, by kind: its fields and their types. The other end's answer to a request is noted
# beside it ("-> kind"); a request's ticket is its first field, and its answer's.
RECORDS = Kinds("record", {
    # the mesh (amqp_server.shards.mesh): first on a link each way, with the sender's incarnation;
    # last on every link of a shard that stops cleanly; every heartbeat/4 on every link
    "hello": {"index": int, "incarnation": str},
    "bye": {},
    "beat": {},
    # to the owner of a queue (amqp_server.shards.owner). A publish with ticket 0 wants no confirm,
    # and one record carries its message to every queue of that shard it was routed to; with a
    # ticket, to one queue (-> "durable" or "rejected", that queue's)
    "pub": {"vhost": str, "queues": Of(list, str), "exchange": str, "routing_key": str, "header": bytes,
            "body": bytes, "ticket": int},
    # -> "consumed" before any delivery
    "consume": {"cid": int, "vhost": str, "queue": str, "tag": str, "no_ack": bool, "exclusive": bool,
                "prefetch": int, "global_prefetch": int, "arguments": dict},
    "cancel": {"cid": int},  # -> "cancelled", behind every delivery to it
    "qos": {"cid": int, "global_prefetch": int},  # the consumer's channel's basic.qos global changed
    "settle": {"cid": int, "outcome": str, "entries": Of(list, int)},  # ack, reject or requeue; cid 0: a get's too
    "credit": {"cid": int, "count": int},  # no-ack deliveries handed to the client
    "acks": {"sent": int},  # behind settles -> "acks_written" once their records are written
    "get": {"ticket": int, "vhost": str, "queue": str, "no_ack": bool},  # -> "got"
    "purge": {"ticket": int, "vhost": str, "queue": str},  # -> "purged"
    "counts": {"ticket": int, "vhost": str, "queue": str},  # -> "counted"
    "reply": {"vhost": str, "token": str, "data": bytes},  # a direct reply to a channel of that shard
    "token": {"ticket": int, "vhost": str, "token": str},  # does its channel live? -> "live"
    # the owner's, to the port of the client's shard (amqp_server.shards.port)
    "hold": {"vhost": str, "queue": str, "holding": bool},  # credit flow: its publishers into the queue wait, or go on
    # the owner's message id: a redelivery is the same message to the client's shard (MQTT QoS 2
    # reuses its packet id by it, amqp_server.mqtt.exactly_once); None for a no-ack delivery
    "deliver": {"cid": int, "entry": int, "redelivered": bool, "deliveries": int, "exchange": str,
                "routing_key": str, "header": bytes, "body": bytes, "message_id": (bytes, NONE)},
    # code 0: the owner's consumer now; else refused (ACCESS_REFUSED: in exclusive use), with its code and text
    "consumed": {"cid": int, "code": int, "text": str},
    "cancelled": {"cid": int},
    "acks_written": {"sent": int},
    "durable": {"ticket": int},
    "rejected": {"ticket": int},
    "got": {"ticket": int, "entry": int, "redelivered": bool, "deliveries": int, "data": (bytes, NONE),
            "count": int},  # data None: the queue is empty
    "counted": {"ticket": int, "messages": int, "consumers": int},
    "purged": {"ticket": int, "count": int},
    "live": {"ticket": int, "live": bool},
    # connections moving between shards (amqp_server.shards.moves): "moved" comes after every
    # record the mover sent before the connection left; "ping" -> "pong" once the records
    # before it are handled
    "moved": {"move": tuple},
    "ping": {"ticket": int},
    "pong": {"ticket": int},
    # definitions (amqp_server.shards.definitions): an order to shard 0 -> "defined" or "refused";
    # shard 0's changes to every other shard -> "applied"; all of them, for a shard that starts -> "synced"
    "define": {"ticket": int, "order": tuple},
    "defined": {"ticket": int, "result": ANY},
    "refused": {"ticket": int, "code": int, "text": str},
    "apply": {"ticket": int, "batch": int, "changes": Of(list, tuple)},
    "applied": {"ticket": int},
    # a sync offers the syncing shard's transient definitions, for shard 0 to make if it lacks them
    "sync": {"ticket": int, "offer": Of(list, tuple)},
    "synced": {"ticket": int, "changes": Of(list, tuple), "batch": int},
    # services (amqp_server.shards.services): a shard's report to shard 0 every REPORT_INTERVAL; a
    # management service of another shard -> "answer" or "failed"; a dead letter for the vhost's
    # log at shard 0 -> "durable" once on disk
    "report": {"index": int, "report": dict},
    "ask": {"ticket": int, "service": str, "args": tuple},
    "answer": {"ticket": int, "answer": ANY},
    "failed": {"ticket": int, "code": int, "text": str},
    "dead": {"ticket": int, "vhost": str, "record": DeadLetter},
    # to every other shard (amqp_server.shards.tallies): all of its counts first on a link, with
    # its node's name (None outside a cluster), then each as it changes; a refused (True) or
    # accepted (False) login
    "tallies": {"counts": Of(dict, int), "node": (str, NONE)},
    "tally": {"kind": str, "name": str, "count": int},
    "login": {"failed": bool, "host": str, "username": str},
})


# The kinds whose fields hold AMQP field tables (a consumer's arguments, those of an order or a
# definition change): sent keeping their byte arrays (codec.keeping_byte_arrays), which a binding
# tells from bytes. Elsewhere a table (a connection's client properties in a report) is shown,
# and a byte array shows as bytes do.
TABLES = frozenset({"consume", "define", "apply", "sync", "synced"})


def table(node) -> dict:
    """Record kind -> its handler, on `node` (a ShardNode): what each part
    of it (amqp_server.shards.mesh, owner, port, moves, services) handles."""
    return {
        # the mesh: links and heartbeats
        "hello": node._on_hello,
        "bye": node._on_bye,
        "beat": node._on_beat,
        # to the owner of a queue
        "pub": node._on_pub,
        "consume": node._on_consume,
        "cancel": node._on_cancel,
        "qos": node._on_qos,
        "settle": node._on_settle,
        "credit": node._on_credit,
        "acks": node._on_acks,
        "get": node._on_get,
        "purge": node._on_purge,
        "counts": node._on_counts,
        "reply": node._on_reply,
        "token": node._on_token,
        # the owner's, to the port of the client's shard
        "hold": node._on_hold,
        "deliver": node._on_deliver,
        "consumed": node._on_consumed,
        "cancelled": node._on_cancelled,
        "acks_written": node._on_acks_written,
        "durable": node._on_durable,
        "rejected": node._on_rejected,
        "got": node._on_got,
        "counted": node._on_counted,
        "purged": node._on_purged,
        "live": node._on_live,
        # connections moving between shards
        "moved": node._on_moved,
        "ping": node._on_ping,
        "pong": node._on_pong,
        # definitions (amqp_server.shards.definitions)
        "define": node.definitions.ordered,
        "defined": node._on_defined,
        "refused": node._on_refused,
        "apply": node.definitions.batch,
        "applied": node._on_applied,
        "sync": node._on_sync,
        "synced": node._on_synced,
        # services: reports, management requests, dead letters, tallies
        "report": node._on_report,
        "ask": node._on_ask,
        "answer": node._on_answer,
        "failed": node._on_failed,
        "dead": node._on_dead,
        "tallies": node.tallies.all_of,
        "tally": node.tallies.one_of,
        "login": node._on_login,
    }
