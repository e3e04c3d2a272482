"""The JSON objects of the management API, in RabbitMQ's shapes and field names.

Fields RabbitMQ reports about Erlang internals (reductions, garbage
collection) are left out; fields clients read (counts, rates, states,
names, flags) are kept with RabbitMQ's names and types. hutch's own
additions are few and named so they cannot clash (`message_states`).
"""
from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from urllib.parse import quote

from vhosts.node import NODE
from amqp_server.management.rates import (CHANNEL_CONSUMING, CHANNEL_PUBLISHING, LENGTHS,  # noqa: F401
                                          QUEUE_STATS, VHOST_STATS, Reading)




def reading_of(req) -> Reading:
    """The rates and, when the query asks for a range, their samples, as this
    request reads them (a 400 for an invalid range)."""
    return Reading(req.node.sampler, req.query)


def message_stats(reading, subject, stats, keys) -> dict | None:
    """RabbitMQ shows message_stats only for objects that saw messages."""
    totals = stats.totals()
    if not any(totals[key] for key in keys):
        return None
    return reading.with_rates([subject], totals, keys, "msg_rates")


def _grouped_stats(reading, stats, groups) -> dict | None:
    """message_stats of a channel or an exchange, which RabbitMQ shows by
    groups, each once one of its counters moved (a channel that only
    consumed has no `publish`; an exchange that routed nothing no
    `publish_out`). `stats` is also the key of the object's history."""
    out = {}
    for keys in groups:
        totals = {key: getattr(stats, key) for key in keys}
        if any(totals.values()):
            out.update(reading.with_rates([stats], totals, keys, "msg_rates"))
    return dict(sorted(out.items())) if out else None


def _with_stats(out: dict, stats) -> dict:
    if stats is not None:
        out["message_stats"] = stats
    return out


def counts(reading, subjects: list, ready: int, unacked: int) -> dict:
    """The lengths of a queue, or the sums over `subjects` (queues or vhosts)."""
    return {
        "messages": ready + unacked,
        "messages_details": reading.details(subjects, LENGTHS, "lengths"),
        "messages_ready": ready,
        "messages_ready_details": reading.details(subjects, ("messages_ready",), "lengths"),
        "messages_unacknowledged": unacked,
        "messages_unacknowledged_details": reading.details(subjects, ("messages_unacknowledged",), "lengths"),
    }


# -- who holds what ------------------------------------------------------------


def _unacked(connections):
    """(queue, entry) of every delivery not acked yet, over every open
    connection, AMQP or MQTT."""
    for connection in list(connections):
        yield from connection.unacked_deliveries()


def unacked_by_queue(connections) -> Counter:
    """Queue -> deliveries not acked yet."""
    return Counter(queue for queue, _entry in _unacked(connections))


def unacked_bytes_by_queue(connections) -> Counter:
    """Queue -> body bytes of the deliveries not acked yet."""
    found: Counter = Counter()
    for queue, entry in _unacked(connections):
        found[queue] += len(entry.message.body)
    return found


def consumers_by_queue(connections) -> dict:
    """Queue -> [(channel, consumer)]."""
    found: dict = {}
    for connection in connections:
        for channel in list(connection.channels.values()):
            for consumer in channel.consumers.values():
                found.setdefault(consumer.queue, []).append((channel, consumer))
    return found


# -- vhosts, users, permissions -------------------------------------------------


def vhost(reading, vhost, unacked: Counter, connections) -> dict:
    ready = sum(q.message_count for q in vhost.queues.values())
    held = sum(unacked[q] for q in vhost.queues.values())
    clients = [c for c in list(connections) if c.vhost is vhost]
    out = {
        "cluster_state": {NODE: "running"},
        "default_queue_type": "undefined",
        "description": vhost.description,
        "metadata": {"description": vhost.description, "tags": list(vhost.tags)},
        "name": vhost.name,
        "tags": list(vhost.tags),
        "tracing": vhost.tracing,
        **counts(reading, [vhost], ready, held),
    }
    for key in ("recv_oct", "send_oct"):
        out[key] = sum(getattr(c, key) for c in clients)
        # over its open connections, as the totals (each connection keeps its own history)
        out[key + "_details"] = reading.details(clients, (key,), "data_rates")
    stats = message_stats(reading, vhost, vhost.stats, VHOST_STATS)
    if stats is not None:
        out["message_stats"] = stats
    return out


def user(found) -> dict:
    return {
        "name": found.name,
        "password_hash": found.password_hash,
        "hashing_algorithm": "rabbit_password_hashing_sha256",
        "tags": list(found.tags),
        "limits": dict(found.limits),
    }


def permission(user_name: str, vhost_name: str, found) -> dict:
    return {"user": user_name, "vhost": vhost_name, "configure": found.configure, "write": found.write,
            "read": found.read}


# -- exchanges, queues, bindings ------------------------------------------------


def exchange(reading, x, vhost_name: str, user_name: str, policy=None) -> dict:
    """`policy`: the `vhosts.policies.Policy` that applies, named only when one does."""
    out = {
        "arguments": x.arguments,
        "auto_delete": x.auto_delete,
        "durable": x.durable,
        "internal": x.internal,
        "name": x.name,
        "type": x.type,
        "user_who_performed_action": user_name,
        "vhost": vhost_name,
    }
    if policy is not None:
        out["policy"] = policy.name
    return _with_stats(out, exchange_stats(reading, x.stats))


def default_exchange(reading, vhost, user_name: str) -> dict:
    out = {"arguments": {}, "auto_delete": False, "durable": True, "internal": False, "name": "",
           "type": "direct", "user_who_performed_action": user_name, "vhost": vhost.name}
    return _with_stats(out, exchange_stats(reading, vhost.default_exchange_stats))


def exchange_stats(reading, stats) -> dict | None:
    return _grouped_stats(reading, stats, (("publish_in",), ("publish_out",)))


def queue(reading, q, unacked: int, unacked_bytes: int, consumers: list, policy=None,
          operator_policy=None) -> dict:
    """`policy`, `operator_policy`: the `vhosts.policies.Policy` and
    `OperatorPolicy` that apply, if any (the queue runs with their
    combination, `q.policy`)."""
    out = queue_declaration(q, policy, operator_policy)
    out.update(queue_figures(reading, q, unacked, unacked_bytes, consumers))
    return out


def queue_declaration(q, policy=None, operator_policy=None) -> dict:
    """What a queue's row shows of its declaration and policies: the same on
    every shard of a node (a RemoteQueue has it too)."""
    return {
        "arguments": q.arguments,
        "auto_delete": q.auto_delete,
        "durable": q.durable,
        "effective_policy_definition": dict(q.policy or {}),
        "exclusive": q.exclusive_owner is not None,
        "name": q.name,
        "node": NODE,
        "operator_policy": operator_policy.name if operator_policy is not None else None,
        "policy": policy.name if policy is not None else None,
        "type": q.kind,
        "vhost": q.vhost,
    }


def queue_figures(reading, q, unacked: int, unacked_bytes: int, consumers: list) -> dict:
    """What a queue's row shows of its contents, consumers and rates: known
    to the shard that owns it (on a node of several shards, the others show
    what it last reported: amqp_server.management.shards)."""
    return figures_of(queue_values(q, unacked, unacked_bytes, consumers),
                      counts(reading, [q], q.message_count, unacked),
                      message_stats(reading, q, q.stats, QUEUE_STATS))


def queue_values(q, unacked: int, unacked_bytes: int, consumers: list) -> list:
    """The figures of a queue that are not rates, as one small list (what a
    shard's report carries per queue): consumers, whether it has any of its
    own (a stream's stream-protocol subscribers are counted, not held),
    ready, unacked, bytes ready and unacked, its message states, the
    exclusive consumer's tag, its exclusive owner's details."""
    return [q.consumer_count, bool(q.consumers), q.message_count, unacked, q.size, unacked_bytes, q.state_counts(),
            next((c.tag for _ch, c in consumers if c.exclusive), None), _owner(q.exclusive_owner)]


def figures_of(values: list, lengths: dict, stats: dict | None) -> dict:
    """A queue's figures from its `queue_values`, its `counts` and its message_stats."""
    consumers, held, ready, unacked, size, unacked_bytes, states, exclusive_tag, owner = values
    paged_out = states.get("delta", 0)
    out = {
        "consumers": consumers,  # a stream's counts its stream-protocol subscriptions too
        "consumer_capacity": 1.0 if held else 0,
        "consumer_utilisation": 1.0 if held else None,
        **owner,
        "exclusive_consumer_tag": exclusive_tag,
        "head_message_timestamp": None,
        "message_bytes": size + unacked_bytes,
        "message_bytes_ready": size,
        "message_bytes_unacknowledged": unacked_bytes,
        "messages_paged_out": paged_out,
        "messages_ram": ready - paged_out,
        "messages_ready_ram": ready - paged_out,
        "messages_unacknowledged_ram": unacked,
        "message_states": states,
        "single_active_consumer_tag": None,
        "state": "running",
        **lengths,
    }
    if stats is not None:
        out["message_stats"] = stats
    return out


def idle_queue_figures(reading) -> dict:
    """The figures of a queue with no messages, consumers or stats (what a
    shard leaves out of its report)."""
    return figures_of((0, False, 0, 0, 0, 0, {"alpha": 0, "gamma": 0, "delta": 0}, None, {}),
                      counts(reading, [], 0, 0), None)


def _owner(connection) -> dict:
    """RabbitMQ's owner_pid_details of an exclusive queue: its connection."""
    if connection is None:
        return {}
    peer_host, peer_port = _peer(connection)
    return {"owner_pid_details": {"name": connection_name(connection), "peer_host": peer_host,
                                  "peer_port": peer_port}}


def binding(vhost_name: str, source: str, dest_kind: str, dest_name: str, key: str, arguments: dict | None) -> dict:
    return {
        "source": source,
        "vhost": vhost_name,
        "destination": dest_name,
        "destination_type": dest_kind,
        "routing_key": key,
        "arguments": arguments or {},
        "properties_key": properties_key(key, arguments),
    }


def properties_key(key: str, arguments: dict | None) -> str:
    """How RabbitMQ names one binding in a URL: the quoted routing key, plus
    a hash of the arguments when there are any."""
    if not arguments:
        return quote(key, safe="") if key else "~"
    return quote(key, safe="") + "~" + _arguments_hash(arguments)


def _arguments_hash(arguments: dict) -> str:
    digest = hashlib.md5(json.dumps(arguments, sort_keys=True, default=str).encode()).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


# -- connections, channels, consumers --------------------------------------------


def connection_name(connection) -> str:
    """RabbitMQ's "peer_host:peer_port -> host:port"."""
    return connection.name


def _peer(connection) -> tuple[str, int]:
    peer = connection.peer or ("", 0)
    return peer[0], peer[1]


def _local(connection) -> tuple[str, int]:
    transport = connection.io.transport
    local = transport.get_extra_info("sockname") if transport is not None else None
    return (local[0], local[1]) if local else ("", 0)


def connection(reading, conn) -> dict:
    peer_host, peer_port = _peer(conn)
    host, port = _local(conn)
    transport = conn.io.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    cipher = ssl_object.cipher() if ssl_object is not None else None
    user = conn.user.name if conn.user is not None else ""
    return {
        "auth_mechanism": conn.auth_mechanism,
        "channel_max": conn.channel_max,
        "channels": len(conn.channels),
        "client_properties": conn.client_properties,
        "connected_at": conn.connected_at,
        "frame_max": conn.frame_max,
        "host": host,
        "name": connection_name(conn),
        "node": NODE,
        "peer_cert_issuer": None,
        "peer_cert_subject": None,
        "peer_cert_validity": None,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "port": port,
        "protocol": conn.protocol,
        "recv_cnt": conn.recv_cnt,
        "recv_oct": conn.recv_oct,
        "recv_oct_details": reading.details([conn], ("recv_oct",), "data_rates"),
        "send_cnt": conn.send_cnt,
        "send_oct": conn.send_oct,
        "send_oct_details": reading.details([conn], ("send_oct",), "data_rates"),
        "send_pend": 0,
        "ssl": ssl_object is not None,
        "ssl_cipher": cipher[0] if cipher else None,
        "ssl_hash": None,
        "ssl_key_exchange": None,
        "ssl_protocol": ssl_object.version() if ssl_object is not None else None,
        "state": _connection_state(conn),
        "timeout": conn.heartbeat,
        "type": "network",
        "user": user,
        "user_who_performed_action": user,
        "vhost": conn.vhost.name if conn.vhost is not None else "",
    }


def _connection_state(conn) -> str:
    """RabbitMQ's words: running, flow (credit flow holds its publishes),
    blocking / blocked (a resource alarm), closing."""
    if conn.state in ("closing", "closed"):
        return "closing"
    return conn.flow_state


def channel_name(channel) -> str:
    return "%s (%d)" % (connection_name(channel.connection), channel.number)


def channel(reading, ch) -> dict:
    conn = ch.connection
    peer_host, peer_port = _peer(conn)
    user = conn.user.name if conn.user is not None else ""
    out = {
        "acks_uncommitted": 0,
        "confirm": ch.confirm,
        "connection_details": {"name": connection_name(conn), "peer_host": peer_host, "peer_port": peer_port},
        "consumer_count": len(ch.consumers),
        "global_prefetch_count": ch.global_prefetch,
        "messages_unacknowledged": len(ch.unacked),
        "messages_uncommitted": 0,
        "messages_unconfirmed": ch.unconfirmed,
        "name": channel_name(ch),
        "node": NODE,
        "number": ch.number,
        "prefetch_count": ch.prefetch_count,
        "state": "running" if ch.flow_active else "flow",
        "transactional": ch.transactional,
        "user": user,
        "user_who_performed_action": user,
        "vhost": ch.vhost.name,
    }
    return _with_stats(out, _grouped_stats(reading, ch.stats, (CHANNEL_PUBLISHING, CHANNEL_CONSUMING)))


def consumer(ch, c) -> dict:
    conn = ch.connection
    peer_host, peer_port = _peer(conn)
    return {
        "arguments": c.arguments,
        "ack_required": not c.no_ack,
        "active": True,
        "activity_status": "up",
        "channel_details": {
            "connection_name": connection_name(conn),
            "name": channel_name(ch),
            "node": NODE,
            "number": ch.number,
            "peer_host": peer_host,
            "peer_port": peer_port,
            "user": conn.user.name if conn.user is not None else "",
        },
        "consumer_tag": c.tag,
        "exclusive": c.exclusive,
        "prefetch_count": c.prefetch_count,
        "queue": {"name": c.queue.name, "vhost": c.queue.vhost},
    }
