"""The records a shard sends another on their link (docs/scaling.md), and
which part of ShardNode handles each kind (`table`). A record is a tuple
whose first item names its kind; its other items are its fields, and its
handler is called with the link it came on and them (so a record of another
arity fails to be handled, and is logged: amqp_server.shards.link); a kind
that is in no table is logged and dropped (Mesh.received).

Records (tuples, amqp_server.shards.link), by the requester:
  ("hello", index, incarnation)           first on a link each way: the dialer's, then the other's
  ("bye",)                                 last on every link of a shard that stops cleanly
  ("pub", vhost, [queues], exchange, routing key, header, body, ticket)
                                           ticket 0: no confirm wanted, and then one record carries a
                                           message to every queue of that shard it was routed to;
                                           with a ticket, one queue (its answer is that queue's)
  ("consume", cid, vhost, queue, tag, no_ack, exclusive, prefetch, global prefetch, arguments)
                                           answered ("consumed", cid, code, text) before any delivery
  ("cancel", cid)                          answered ("cancelled", cid) behind every delivery to it
  ("qos", cid, global prefetch)            the consumer's channel's basic.qos global changed
  ("settle", cid, outcome, [entry ids])    ack, reject or requeue; cid 0: a get
  ("credit", cid, n)                       no-ack deliveries handed to the client
  ("acks", n)                              after settles: answer once their records are written
  ("get", ticket, vhost, queue, no_ack)
  ("reply", vhost, token, data)            a direct reply to a channel of that shard (no answer)
  ("token", ticket, vhost, token)          does that shard's channel of this reply token live?
  ("hold", vhost, queue, holding)         credit flow: that shard's publishers into the queue wait, or go on
  ("counts", ticket, vhost, queue)
  ("purge", ticket, vhost, queue)
  ("define", ticket, op)                   to shard 0 (amqp_server.shards.definitions)
  ("sync", ticket, offer)                  to shard 0: all its definitions, please; and the
                                           sender's transient ones, for shard 0 to make if it lacks them
  ("apply", ticket, batch, changes)        from shard 0 to every other shard
  ("report", index, report)               to shard 0, every REPORT_INTERVAL (no answer)
  ("ask", ticket, service, args)          a management service of another shard
  ("dead", ticket, vhost, record)          to shard 0: a dead letter for the vhost's log (answer: durable)
  ("moved", (pid, n))                      a connection this shard sent there (hand_over) after every
                                           record it sent before leaving
  ("ping", ticket)                         answered ("pong", ticket) once the records before it are handled
  ("beat",)                                 on every link every heartbeat/4 (no answer)
  ("tallies", counts, node) ("tally", kind, name, count) ("login", failed, host, username)
                                           to every other shard (amqp_server.shards.tallies)
and by the owner, on the same link:
  ("durable", ticket) ("rejected", ticket) ("acks_written", n)
  ("deliver", cid, entry id, redelivered, deliveries, exchange, routing key, header, body, message id)
                                           the owner's message id (None for a no-ack delivery): a redelivery
                                           is the same message to the client's shard (MQTT QoS 2 reuses
                                           its packet id by it, amqp_server.mqtt.exactly_once)
  ("consumed", cid, code, text)            code 0: the consumer is the owner's; else refused (ACCESS_REFUSED: in
                                           exclusive use), with the owner's code and text
  ("cancelled", cid) ("got", ticket, entry id, redelivered, deliveries, data, count)
  ("live", ticket, bool) ("counted", ticket, messages, consumers) ("purged", ticket, count) ("defined", ticket, result)
  ("refused", ticket, code, text) ("applied", ticket) ("synced", ticket, changes, batch)
  ("answer", ticket, answer) ("failed", ticket, code, text)
"""
from __future__ import annotations


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
