"""Handlers that move messages: queue get, queue purge, exchange publish,
and the aliveness test (RabbitMQ's debugging operations).

They use the same domain calls as basic.get / queue.purge / basic.publish,
so counts, routing and durability are those of AMQP. Messages fetched by a
get are given back (requeue, redelivered=true) or dropped after all of
them are taken, as RabbitMQ does, so one get never returns a message twice.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import datetime
import itertools
import struct

from pamqp import commands, header
from storage import Message
from vhosts.errors import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, AMQPError

from vhosts import firehose, reply_to
from vhosts.properties import check_properties
from vhosts.node import NODE
from amqp_server.management import shards
from amqp_server.management.errors import (ApiError, amqp_errors_as_http, bad_request, missing_keys,
                                           not_authorised)
from amqp_server.management.http import NO_CONTENT
from amqp_server.management.resources import exchange_name, find_queue

ACK_MODES = {
    "ack_requeue_true": True,
    "reject_requeue_true": True,
    "ack_requeue_false": False,
    "reject_requeue_false": False,
}
# RabbitMQ's JSON name -> pamqp's attribute, where they differ
PROPERTY_NAMES = {"type": "message_type"}
INT_PROPERTIES = ("delivery_mode", "priority", "timestamp")
PROPERTY_FIELDS = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                   "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id")


class _HttpPublisher:
    """The publisher a vhost tells to wait under credit flow: an HTTP
    publish is one message, so there is nothing to pause."""

    def throttled_by(self, source) -> None:
        source.flow_waiters.discard(self)

    def unblocked(self, source) -> None:
        """Nothing waits."""


_PUBLISHER = _HttpPublisher()
_requests = itertools.count(1)


def _origin(user_name: str) -> firehose.Origin:
    """Who publishes or gets through the API, for the firehose: RabbitMQ
    names the internal connection of each request by its Erlang pid."""
    return firehose.Origin("<%s.1.%d.0>" % (NODE, next(_requests)), 1, user_name)


def _queue_to_get(req):
    """The queue of a get, refused as basic.get on a channel would be
    (a denied read is RabbitMQ's 401 with the channel's reply text)."""
    v = req.vhost(req.params["vhost"])
    try:
        queue = v.queue(req.params["name"], None)
        req.access(v).check("queue", queue.name, "read")
        return v, queue
    except AMQPError as exc:
        if exc.reply_code == NOT_FOUND:
            raise ApiError(404, "not_found", exc.reply_text) from None
        if exc.reply_code == ACCESS_REFUSED:
            raise not_authorised(exc.reply_text) from None
        raise channel_error(exc) from None


async def _fetch(queue):
    """The head entry, waiting while it is read back from disk; None when empty."""
    while True:
        entry = queue.get()
        if entry is not None or not queue.message_count or queue.deleted:
            return entry
        ready = asyncio.get_running_loop().create_future()
        queue.when_available(lambda: ready.done() or ready.set_result(None))
        await ready


def _positive_int(body: dict, key: str) -> int:
    value = body[key]
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise bad_request("%s must be a non-negative integer" % key)
    return value


async def get_messages(req) -> list:
    """On a node of several shards, the shard that owns the queue takes the
    messages (`take`, asked through amqp_server.management.shards)."""
    body = req.body()
    missing_keys(body, ("ackmode", "count", "encoding"))
    if body["ackmode"] not in ACK_MODES:
        raise bad_request("Unsupported ackmode: %s" % body["ackmode"])
    if body["encoding"] not in ("auto", "base64"):
        raise bad_request("Unsupported encoding: %s" % body["encoding"])
    asked = {"ackmode": body["ackmode"], "encoding": body["encoding"], "count": _positive_int(body, "count"),
             "truncate": _positive_int(body, "truncate") if body.get("truncate") is not None else None}
    v, queue = _queue_to_get(req)
    if not getattr(queue, "remote", False):
        return await take(v, queue, asked, req.user.name)
    try:
        return await shards.at_owner(req.node, queue, "queue.get", v.name, queue.name, asked, req.user.name)
    except AMQPError as exc:
        raise refused_get(exc) from None


@shards.service("queue.get")
async def _take_here(node, vhost: str, name: str, asked: dict, user_name: str) -> list:
    found = shards.owned_queue(node, vhost, name)
    return [] if found is None else await take(*found, asked, user_name)


async def take(v, queue, asked: dict, user_name: str) -> list:
    """The API's get from a queue of this shard: `asked` is the request's
    checked ackmode, encoding, count and truncate."""
    origin = _origin(user_name)
    taken, out = [], []
    for _ in range(asked["count"]):
        try:
            entry = await _fetch(queue)
        except AMQPError as exc:  # a stream refuses basic.get: nothing was taken yet
            raise refused_get(exc) from None
        if entry is None:
            break
        if v.tracing:
            firehose.delivered(v, origin, queue, entry.message, entry.redelivered)
        taken.append(entry)
        queue.stats.get += 1
        v.stats.get += 1
        out.append(rendered(entry, queue.message_count, asked["encoding"], asked["truncate"]))
    if taken:
        if ACK_MODES[asked["ackmode"]]:
            queue.requeue(taken)
        else:
            queue.ack(taken)
    return out


def rendered(entry, message_count: int, encoding: str, truncate: int | None) -> dict:
    message = entry.message
    payload = message.body if truncate is None else message.body[:truncate]
    text = None
    if encoding == "auto":
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    return {
        "payload_bytes": len(message.body),
        "redelivered": entry.redelivered,
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "message_count": message_count,
        "properties": properties_json(message.properties),
        "payload": text if text is not None else base64.b64encode(payload).decode("ascii"),
        "payload_encoding": "string" if text is not None else "base64",
    }


def properties_json(props):
    """Set properties by RabbitMQ's names; [] when none (RabbitMQ's empty list)."""
    out = {}
    for name in PROPERTY_FIELDS:
        value = getattr(props, PROPERTY_NAMES.get(name, name), None)
        if value is None or (name == "cluster_id" and value == ""):
            continue
        if isinstance(value, datetime.datetime):
            value = int(value.replace(tzinfo=value.tzinfo or datetime.timezone.utc).timestamp())
        out[name] = value
    return out or []


async def purge(req):
    """A queue of another shard is purged by its owner (as AMQP's queue.purge of it)."""
    v, queue = find_queue(req)
    with amqp_errors_as_http():
        if not getattr(queue, "remote", False):
            v.purge_queue(queue.name, None, access=req.access(v))
            return NO_CONTENT
        req.access(v).check("queue", queue.name, "read")
        v.queue(queue.name, None)  # an exclusive queue is locked to its connection
        await shards.purged(req.node, queue)
    return NO_CONTENT


def _properties(value) -> commands.Basic.Properties:
    """Properties by RabbitMQ's JSON names; names it does not know are
    ignored, as RabbitMQ ignores them; a wrong type is its 400."""
    if not isinstance(value, dict):
        raise bad_request(["not_table", "properties"])
    kwargs = {}
    for key, item in value.items():
        if key not in PROPERTY_FIELDS:
            continue
        if key in INT_PROPERTIES and (not isinstance(item, int) or isinstance(item, bool)):
            raise bad_request(["not_int", key])
        if key == "headers" and not isinstance(item, dict):
            raise bad_request(["not_table", key])
        if key not in INT_PROPERTIES and key != "headers" and not isinstance(item, str):
            raise bad_request(["not_string", key])
        kwargs[PROPERTY_NAMES.get(key, key)] = item
    if "timestamp" in kwargs:
        kwargs["timestamp"] = datetime.datetime.fromtimestamp(kwargs["timestamp"], datetime.timezone.utc)
    try:
        return commands.Basic.Properties(**kwargs)
    except (TypeError, ValueError, OverflowError) as exc:
        raise bad_request("invalid properties: %s" % exc) from None


def _payload(body: dict) -> bytes:
    payload, encoding = body["payload"], body["payload_encoding"]
    if not isinstance(payload, str):
        raise bad_request(["not_string", "payload"])
    if encoding == "string":
        return payload.encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise bad_request(["not_base64", payload]) from None
    raise bad_request(["unsupported_encoding", encoding])


def refused_get(error: AMQPError) -> ApiError:
    """A get the queue refuses (a stream's 540): RabbitMQ 3.10 answers 400
    with the code and the explanation alone, "540 basic.get not supported by
    stream queues queue 'q' in vhost '/'"."""
    return bad_request("%d %s" % (error.reply_code, error.reply_text.split(" - ", 1)[-1]))


def channel_error(error: AMQPError) -> ApiError:
    """RabbitMQ runs get and publish on an AMQP channel: a refusal comes back
    as that channel's close, code and text."""
    return bad_request("%d %s" % (error.reply_code, error.reply_text))


def publish(req) -> dict:
    body = req.body()
    missing_keys(body, ("routing_key", "properties", "payload", "payload_encoding"))
    v = req.vhost(req.params["vhost"])
    if v.name not in req.user.permissions:
        # RabbitMQ publishes on a connection of the user's to the vhost, which it may not open
        raise not_authorised("Access refused.")
    exchange = exchange_name(req.params["name"])
    routing_key = body["routing_key"]
    if not isinstance(routing_key, str):
        raise bad_request(["not_string", "routing_key"])
    payload = _payload(body)
    props = _properties(body["properties"])
    limit = req.node.config.max_message_size
    try:
        checks = req.access(v)
        checks.publish(exchange)
        x = v.check_publish(exchange)
        checks.topic(x, routing_key, "write")
        if len(payload) > limit:
            raise AMQPError(PRECONDITION_FAILED, "message size %d is larger than configured max size %d"
                            % (len(payload), limit))
        if props.reply_to == reply_to.PSEUDO_QUEUE:
            raise reply_to.no_consumer()
        check_properties(props, req.user)
    except AMQPError as exc:
        raise channel_error(exc) from None
    try:
        content = header.ContentHeader(0, len(payload), props).marshal()
    except (TypeError, ValueError, OverflowError, struct.error) as exc:
        raise bad_request("invalid properties: %s" % exc) from None
    message = Message(exchange, routing_key, content, payload)
    if v.tracing:
        firehose.published(v, _origin(req.user.name), message, [routing_key], props.headers)
    reached, _waits, _rejected = v.publish(message, [routing_key], props.headers, _PUBLISHER)
    if not reached:
        v.stats.drop_unroutable += 1
    return {"routed": bool(reached)}


async def aliveness_test(req) -> dict:
    """RabbitMQ's: declare aliveness-test, publish to it, get it back, with
    the user's permissions (a refusal is 401 with the channel's text)."""
    v = req.vhost(req.params["vhost"])
    checks = req.access(v)
    try:
        queue = v.declare_queue("aliveness-test", None, access=checks)
        checks.publish("")
        checks.check("queue", queue.name, "read")
    except AMQPError as exc:
        if exc.reply_code == ACCESS_REFUSED:
            raise not_authorised(exc.reply_text) from None
        raise channel_error(exc) from None
    props = commands.Basic.Properties()
    content = header.ContentHeader(0, len(b"test_message"), props).marshal()
    v.publish(Message("", "aliveness-test", content, b"test_message"), ["aliveness-test"], None, _PUBLISHER)
    entry = await _fetch(queue)
    if entry is None:
        return {"status": "failed", "reason": "the test message did not come back"}
    queue.ack((entry,))
    return {"status": "ok"}
