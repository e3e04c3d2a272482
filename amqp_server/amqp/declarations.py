"""exchange.* and queue.* methods: translate each into one vhost call and reply.

In a cluster the reply waits until the in-sync followers hold the change
(`Broker.durability_barrier`, set by the leader): a declare-ok promises
that the declared thing survives a failover. On a single node it goes at
once (the definitions store has committed it to disk already).

On a node of several shards (`Broker.order_definition` set) a change is
ordered by shard 0 and made on every shard before the reply
(amqp_server.shards.definitions): the connection reads nothing more until
then, so its next method sees the change, and a refusal closes the channel
(or the connection) as it would here.

Every handler takes (channel, method). Names given as "" mean the channel's
most recently declared queue (spec: queue-name shortcut), and a binding key of
"" with that shortcut means the queue's name, as RabbitMQ expands them.
"""
from __future__ import annotations

from pamqp import commands

from vhosts import reply_to
from vhosts.errors import AMQPError
from amqp_server.amqp.framing import named_method


def _reply(channel, method) -> None:
    barrier = channel.connection.broker.durability_barrier
    if barrier is None:
        channel.send_method(method)
    else:
        barrier(lambda: channel.state == "open" and channel.send_method(method))  # unless closed meanwhile


class _Hold:
    """What holds a connection's reading while its change is ordered."""

    __slots__ = ()


def _ordered(channel, m, method: str, args: tuple, answer) -> bool:
    """On a node of several shards: have `method` (a vhost call) ordered
    with `args`, then `answer(result)`; False on a node of one shard."""
    order = channel.connection.broker.order_definition
    if order is None:
        return False
    held(channel, m, lambda done: order(method, args, channel.connection, channel.vhost, done), answer)
    return True


def held(channel, m, start, answer) -> None:
    """start(done) something another shard answers; the connection reads
    nothing more until done(result or AMQPError), then `answer(result)`
    (also amqp_server.amqp.deliveries': a consume or cancel of another
    shard's queue)."""
    connection = channel.connection
    hold = _Hold()
    connection.throttled_by(hold)

    def done(result) -> None:
        connection.unblocked(hold)
        if channel.state != "open" or channel.connection.channels.get(channel.number) is not channel:
            return  # closed meanwhile
        if isinstance(result, AMQPError):
            result.at(m.index >> 16, m.index & 0xFFFF)
            if result.closes_connection:
                connection.close_with(result)
            else:
                channel.close_with(result)
            return
        answer(result)

    start(done)


def exchange_declare(channel, m) -> None:
    if _ordered(channel, m, "exchange_declare", (m.exchange, m.exchange_type, m.passive, m.durable, m.auto_delete,
                                                 m.internal, m.arguments),
                lambda _result: m.nowait or _reply(channel, commands.Exchange.DeclareOk())):
        return
    channel.vhost.declare_exchange(
        m.exchange, m.exchange_type, m.passive, m.durable, m.auto_delete, m.internal, m.arguments,
        channel.access,
    )
    if not m.nowait:
        _reply(channel, commands.Exchange.DeclareOk())


def exchange_delete(channel, m) -> None:
    if _ordered(channel, m, "exchange_delete", (m.exchange, m.if_unused),
                lambda _result: m.nowait or _reply(channel, commands.Exchange.DeleteOk())):
        return
    channel.vhost.delete_exchange(m.exchange, m.if_unused, channel.access)
    if not m.nowait:
        _reply(channel, commands.Exchange.DeleteOk())


def exchange_bind(channel, m) -> None:
    if _ordered(channel, m, "exchange_bind", (m.destination, m.source, m.routing_key, m.arguments),
                lambda _result: m.nowait or _reply(channel, commands.Exchange.BindOk())):
        return
    channel.vhost.bind_exchange(m.destination, m.source, m.routing_key, m.arguments, channel.access)
    if not m.nowait:
        _reply(channel, commands.Exchange.BindOk())


def exchange_unbind(channel, m) -> None:
    if _ordered(channel, m, "exchange_unbind", (m.destination, m.source, m.routing_key, m.arguments),
                lambda _result: m.nowait or _reply(channel, commands.Exchange.UnbindOk())):
        return
    channel.vhost.unbind_exchange(m.destination, m.source, m.routing_key, m.arguments, channel.access)
    if not m.nowait:
        _reply(channel, commands.Exchange.UnbindOk())


def queue_declare(channel, m) -> None:
    if m.queue.startswith(reply_to.PSEUDO_QUEUE):
        _reply_to_declare(channel, m)
        return
    if _ordered(channel, m, "queue_declare", (m.queue, m.passive, m.durable, m.exclusive, m.auto_delete, m.arguments),
                lambda result: _declared(channel, m, result)):
        return
    queue = channel.vhost.declare_queue(
        m.queue, channel.connection, m.passive, m.durable, m.exclusive, m.auto_delete, m.arguments,
        channel.access,
    )
    if m.exclusive and not m.passive:
        channel.connection.own_exclusive(queue)
    channel.most_recent_queue = queue.name
    if not m.nowait:
        _reply(channel,
            named_method(commands.Queue.DeclareOk,
                queue=queue.name, message_count=queue.message_count, consumer_count=queue.consumer_count
            )
        )


def _declared(channel, m, result) -> None:
    """A declare ordered on a node of several shards: the queue is here now
    (maybe as another shard's); its counts are its owner's."""
    name = result[0]
    queue = channel.vhost.queues.get(name)
    if queue is None:  # deleted again meanwhile
        channel.close_with(channel.vhost.no_queue(name).at(50, 10))
        return
    if m.exclusive and not m.passive:
        channel.connection.own_exclusive(queue)
    channel.most_recent_queue = name
    if m.nowait:  # no answer, but the declare still renews x-expires where the queue lives
        channel.vhost.shards.counts(queue, lambda _error: None)
        return

    def counted(error) -> None:
        if channel.state != "open":
            return  # closed meanwhile
        if error is not None:  # its owner is down: RabbitMQ's 404 for a queue whose node is
            channel.close_with(error.at(50, 10))
            return
        _reply(channel, named_method(commands.Queue.DeclareOk, queue=name, message_count=queue.message_count,
                                     consumer_count=queue.consumer_count))

    channel.vhost.shards.counts(queue, counted)


def _reply_to_declare(channel, m) -> None:
    """The pseudo-queue and a live token exist for any declare (RabbitMQ: 0
    messages, 1 consumer, no permission checked); other such names are 404.
    A token of a channel on another shard is that shard's to answer."""
    vhost = channel.vhost
    if reply_to.elsewhere(vhost, m.queue):
        held(channel, m, lambda done: vhost.shards.reply_token(vhost.name, m.queue, done),
              lambda live: _reply_to_declared(channel, m, live))
        return
    _reply_to_declared(channel, m, reply_to.declared(vhost, m.queue))


def _reply_to_declared(channel, m, live: bool) -> None:
    if not live:
        channel.close_with(channel.vhost.no_queue(m.queue).at(50, 10))
        return
    channel.most_recent_queue = m.queue
    if not m.nowait:
        channel.send_method(named_method(commands.Queue.DeclareOk, queue=m.queue, message_count=0, consumer_count=1))


def _binding_target(channel, m) -> tuple[str, str]:
    queue = channel.queue_name(m.queue)
    key = m.routing_key if (m.queue or m.routing_key) else queue
    return queue, key


def queue_bind(channel, m) -> None:
    queue, key = _binding_target(channel, m)
    if _ordered(channel, m, "queue_bind", (queue, m.exchange, key, m.arguments),
                lambda _result: m.nowait or _reply(channel, commands.Queue.BindOk())):
        return
    channel.vhost.bind_queue(queue, m.exchange, key, m.arguments, channel.connection, channel.access)
    if not m.nowait:
        _reply(channel, commands.Queue.BindOk())


def queue_unbind(channel, m) -> None:
    queue, key = _binding_target(channel, m)
    if _ordered(channel, m, "queue_unbind", (queue, m.exchange, key, m.arguments),
                lambda _result: _reply(channel, commands.Queue.UnbindOk())):
        return
    channel.vhost.unbind_queue(queue, m.exchange, key, m.arguments, channel.connection, channel.access)
    _reply(channel, commands.Queue.UnbindOk())


def queue_purge(channel, m) -> None:
    vhost = channel.vhost
    queue = vhost.queues.get(channel.queue_name(m.queue))
    if getattr(queue, "remote", False):  # another shard's: it purges (the checks are made here)
        channel.access.check("queue", queue.name, "read")
        vhost.queue(queue.name, channel.connection)
        queue.check_purge()
        held(channel, m, lambda done: vhost.shards.purge(queue, done),
              lambda count: m.nowait or _reply(channel, commands.Queue.PurgeOk(message_count=count)))
        return
    count = channel.vhost.purge_queue(channel.queue_name(m.queue), channel.connection, channel.access)
    if not m.nowait:
        _reply(channel, commands.Queue.PurgeOk(message_count=count))


def queue_delete(channel, m) -> None:
    if _ordered(channel, m, "queue_delete", (channel.queue_name(m.queue), m.if_unused, m.if_empty),
                lambda count: m.nowait or _reply(channel, commands.Queue.DeleteOk(message_count=count))):
        return
    count = channel.vhost.delete_queue(
        channel.queue_name(m.queue), channel.connection, m.if_unused, m.if_empty, channel.access)
    if not m.nowait:
        _reply(channel, commands.Queue.DeleteOk(message_count=count))


HANDLERS = {
    commands.Exchange.Declare: exchange_declare,
    commands.Exchange.Delete: exchange_delete,
    commands.Exchange.Bind: exchange_bind,
    commands.Exchange.Unbind: exchange_unbind,
    commands.Queue.Declare: queue_declare,
    commands.Queue.Bind: queue_bind,
    commands.Queue.Unbind: queue_unbind,
    commands.Queue.Purge: queue_purge,
    commands.Queue.Delete: queue_delete,
}
