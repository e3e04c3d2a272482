"""The management face on a node of several shards (docs/management.md,
"Management on a node of several shards"; docs/scaling.md for the shards).

Shard 0 serves the HTTP API, the UI and /metrics. What it shows of the
other shards comes from their reports (`report`, built here): the rows of
a shard's connections, channels and consumers in the API's shapes, the
figures of the queues it owns (only those with messages, consumers or
counted messages: an idle queue's figures are known without a report, so
thousands of idle queues cost nothing), the message counters it kept for
other shards' queues and exchanges (a publish is counted where it
arrives), per vhost its message_stats and lengths, and its process's
figures (memory, descriptors, sockets, churn, storage: `own_figures`),
which shard 0 adds to its own to show one node (`node_figures`). A
shard that stops reporting (`silent`) has its queues shown "down".

A request asks every other shard for the parts of its report it needs,
at once (`gathered`: the "report" service); a shard that does not answer
within FRESH_WAIT (busy, or restarting) is shown as it last reported:
every shard sends shard 0 its whole report every second anyway
(amqp_server.shards.services, REPORT_INTERVAL). Rates are each shard's own (its
sampler), summed; so are the samples of a range.

Operations on another shard's objects are requests to its `services`
(ShardNode.ask): close a connection, get messages (the owner takes them),
fresh figures of one queue. A purge is the node's own (ShardNode.purge, the
one AMQP's queue.purge of another shard's queue uses).

`node.shards` (management.node.Node) is the ShardNode, given by the
composition root and used by its duck type: `here`, `shard.count`,
`reports`, `peers`, `held`, `ask`, `purge`.
"""
from __future__ import annotations

import asyncio
import functools
import os
import resource

from vhosts.errors import CONNECTION_FORCED, AMQPError
from vhosts.stats import CHURN_FIELDS

from amqp_server.shared.alarms import DISK, MEMORY

from amqp_server.management import access, shapes
from amqp_server.management.errors import ApiError
from amqp_server.management.rates import QUEUE_STATS, VHOST_STATS, Reading

# Seconds shard 0 waits for another shard's answer before it shows what that shard last reported.
FRESH_WAIT = 0.5
# What a report holds (a request asks for the parts it needs).
PARTS = ("connections", "channels", "consumers", "queues", "counted", "exchanges", "vhosts", "node")
# Seconds without a report after which a shard is silent (hung, or ended and
# not back): its queues show as "down". Five of the reports every shard sends
# each second (amqp_server.shards.services.REPORT_INTERVAL).
SILENT_AFTER = 5.0
# A shard's process figures that add up to the node's (`own_figures`), with
# `_details` for those sampled (rates.NODE_FIGURES and the churn counters).
# Of the churn, a shard's connections and channels are its own; the queue
# counters are shard 0's alone: every declaration and deletion is ordered
# there (amqp_server.shards.definitions), and the other shards' counts are
# those of the copies they made.
PROCESS_FIGURES = ("mem_used", "fd_used", "sockets_used")
CLIENT_CHURN = tuple(key for key in CHURN_FIELDS if key.startswith(("connection_", "channel_")))
SUMMED = tuple(key + suffix for key in PROCESS_FIGURES + CLIENT_CHURN for suffix in ("", "_details")) + (
    "fd_total", "sockets_total")


class LinkHolder:
    """The links to the other shards as one more holder of deliveries: the
    entries of this shard's queues delivered to a client of another shard
    and not settled yet (ShardNode.held). They count as unacknowledged
    where their queue is, as the owner's figures are the queue's figures."""

    def __init__(self, shards) -> None:
        self.shards = shards
        self.channels: dict = {}  # none of its own: its consumers are in the other shards' rows

    def unacked_deliveries(self):
        for held in list(self.shards.held.values()):
            for queue, entry, _consumer in list(held.values()):
                yield queue, entry


def holders(node) -> list:
    """What holds deliveries of this shard's queues: its connections and,
    on a node of several shards, the links."""
    found = list(node.connections)
    if node.shards is not None:
        found.append(LinkHolder(node.shards))
    return found


def marked(node, row: dict) -> dict:
    """A row of one of this shard's objects, with its "shard" on a node of several."""
    if node.shards is not None:
        row["shard"] = node.shards.here
    return row


def shard_count(node) -> int:
    return node.shards.shard.count if node.shards is not None else 1


def reports(node) -> list[tuple[int, dict]]:
    """(shard, report) of every other shard, as last reported (shard 0 keeps them)."""
    if node.shards is None:
        return []
    return [(index, report) for index, (_at, report) in sorted(node.shards.reports.items())]


def silent(node) -> set[int]:
    """The other shards that are not reporting: ended and not reported
    since they started again (ShardNode drops a report with its link), or
    whose last report is older than SILENT_AFTER (hung)."""
    if node.shards is None:
        return set()
    now = asyncio.get_running_loop().time()
    known = node.shards.reports
    return {index for index in range(node.shards.shard.count) if index != node.shards.here
            and (index not in known or now - known[index][0] > SILENT_AFTER)}


def own_figures(node, reading) -> dict:
    """This process in RabbitMQ's node fields: memory, descriptors, sockets
    and churn (with their rates, and the samples of a node_stats range),
    its alarms, and its storage's figures (`Node.storage_figures`): the
    "node" part of its report."""
    figures = node.figures()
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    out = {"os_pid": str(os.getpid()), "fd_total": limit, "sockets_total": limit,
           "mem_alarm": MEMORY in node.alarms.raised, "disk_free_alarm": DISK in node.alarms.raised}
    for key in PROCESS_FIGURES:
        out[key] = figures[key]
        out[key + "_details"] = reading.details([node.broker], (key,), "node_stats")
    out.update(reading.with_rates([node.broker], node.broker.churn.totals(), CHURN_FIELDS, "node_stats"))
    out["storage"] = node.storage_figures()
    return out


def node_figures(node, reading, found) -> tuple[dict, dict]:
    """(the node's figures, each shard's own by shard): shard 0's
    `own_figures` plus every other's (`found`: their reports, with
    "node"), SUMMED as RabbitMQ shows one node; an alarm is the node's
    when any shard has it raised (its publishers are blocked)."""
    own = own_figures(node, reading)
    total, by_shard = own, {shard_here(node): own}
    for index, found_report in found:
        theirs = found_report["node"]
        by_shard[index] = theirs
        total = {**total, **add_figures({key: total[key] for key in SUMMED}, {key: theirs[key] for key in SUMMED}),
                 "mem_alarm": total["mem_alarm"] or theirs["mem_alarm"],
                 "disk_free_alarm": total["disk_free_alarm"] or theirs["disk_free_alarm"],
                 "storage": add_figures(total["storage"], theirs["storage"])}
    return total, by_shard


def shard_here(node) -> int:
    return node.shards.here if node.shards is not None else 0


def breakdown(node, by_shard: dict) -> dict[str, dict]:
    """hutch's `shard_reports` of a node: by shard, whether it reports
    (`running`), seconds since its last periodic report (`report_age`;
    shard 0 is the one that keeps them), and its own process figures."""
    now = asyncio.get_running_loop().time()
    down = silent(node)
    out = {}
    for index in range(shard_count(node)):
        row = {"running": index not in down}
        last = node.shards.reports.get(index)
        row["report_age"] = 0.0 if index == node.shards.here else None if last is None else round(now - last[0], 3)
        figures = by_shard.get(index)
        if figures is not None:
            row.update({key: figures[key] for key in ("os_pid", "mem_alarm", "disk_free_alarm") + PROCESS_FIGURES})
        out[str(index)] = row
    return out


async def gathered(node, parts: tuple, reading=None) -> list[tuple[int, dict]]:
    """(shard, report with `parts`) of every other shard, asked now (read
    as `reading` reads, with the samples of its ranges); as last reported
    when it does not answer within FRESH_WAIT; left out when it never
    reported."""
    if node.shards is None:
        return []
    others = [index for index in range(node.shards.shard.count) if index != node.shards.here]
    asked = (reading or Reading(node.sampler, {})).asked()
    linked = node.shards.peers  # a request to a shard without a link would wait for its restart
    answers = await asyncio.gather(*(asyncio.wait_for(ask(node, index, "report", parts, asked), FRESH_WAIT)
                                     if index in linked else _not_linked(index) for index in others),
                                   return_exceptions=True)
    found = []
    for index, answer in zip(others, answers):
        if isinstance(answer, BaseException):  # busy, or ended (TimeoutError, ShardGone)
            last = node.shards.reports.get(index)
            if last is None:
                continue
            answer = last[1]
        found.append((index, answer))
    return found


async def _not_linked(index: int):
    raise ConnectionError("no link to shard %d" % index)


def remote_rows(found, kind: str) -> list[dict]:
    """The rows of `kind` ("connections", "channels", "consumers") of the other shards' reports `found`."""
    return [row for _index, report in found for row in report[kind]]


def visible_rows(req, found, kind: str, vhost_name: str | None = None) -> list[dict]:
    """Other shards' connection or channel rows this user may see (its own;
    all of them for monitoring and administrator users), of one vhost or all."""
    everything = access.sees_everything(req.user)
    return [row for row in remote_rows(found, kind)
            if (everything or row["user"] == req.user.name) and (vhost_name is None or row["vhost"] == vhost_name)]


def consumer_rows(node, found, q) -> list[dict]:
    """The consumers of queue `q` on every shard (`found`: the others' reports)."""
    rows = [marked(node, shapes.consumer(channel, consumer))
            for channel, consumer in shapes.consumers_by_queue(node.connections).get(q, [])]
    rows += [row for row in remote_rows(found, "consumers")
             if row["queue"]["name"] == q.name and row["queue"]["vhost"] == q.vhost]
    return rows


def _counted(stats) -> bool:
    """Whether a queue's counters moved (deliver_get is their sum)."""
    return any(getattr(stats, key) for key in QUEUE_STATS if key != "deliver_get")


def busy(queue, unacked: int) -> bool:
    """Whether a queue's figures are not those of an idle one (`shapes.idle_queue_figures`)."""
    return bool(queue.message_count or queue.consumer_count or unacked or _counted(queue.stats))


def report(node, parts: tuple = PARTS, asked=None) -> dict:
    """This shard's report, or the `parts` of it asked for (see the module's
    note), read as another shard's request reads (`asked`: Reading.asked)."""
    reading = Reading(node.sampler, {}) if asked is None else Reading.answering(node.sampler, asked)
    out = {}
    if {"connections", "channels", "consumers"} & set(parts):
        out.update(_clients(node, reading))
    if {"queues", "counted", "vhosts"} & set(parts):
        out.update(_queues(node, reading))
    if "node" in parts:
        out["node"] = own_figures(node, reading)
    if "exchanges" in parts:
        out["exchanges"] = {(v.name, name): shapes.exchange_stats(reading, stats)
                            for v in list(node.broker.vhosts.values())
                            for name, stats in _exchange_counters(v) if stats.publish_in}
    return {part: out[part] for part in parts}


def _clients(node, reading) -> dict:
    connections, channels, consumers = [], [], []
    for connection in sorted((c for c in list(node.connections) if c.vhost is not None),
                             key=lambda c: c.connected_at):
        connections.append(marked(node, shapes.connection(reading, connection)))
        for _number, channel in sorted(connection.channels.items()):
            channels.append(marked(node, shapes.channel(reading, channel)))
            consumers += [marked(node, shapes.consumer(channel, c)) for c in channel.consumers.values()]
    return {"connections": connections, "channels": channels, "consumers": consumers}


def _exchange_counters(v):
    """(name, ExchangeStats) of a vhost's exchanges, the default one ("") first."""
    yield "", v.default_exchange_stats
    for name, x in list(v.exchanges.items()):
        yield name, x.stats


def _queues(node, reading) -> dict:
    held = holders(node)
    unacked = shapes.unacked_by_queue(held)
    unacked_bytes = shapes.unacked_bytes_by_queue(held)
    by_queue = shapes.consumers_by_queue(node.connections)
    queues, counted, vhosts = {}, {}, {}
    for v in list(node.broker.vhosts.values()):
        ready = waiting = 0
        for q in list(v.queues.values()):
            if getattr(q, "remote", False):
                if _counted(q.stats):
                    counted[(v.name, q.name)] = shapes.message_stats(reading, q, q.stats, QUEUE_STATS)
                continue
            ready += q.message_count
            waiting += unacked[q]
            if busy(q, unacked[q]):  # a range's samples do not pack: its figures whole
                queues[(v.name, q.name)] = (
                    shapes.queue_figures(reading, q, unacked[q], unacked_bytes[q], by_queue.get(q, []))
                    if reading.ranges else packed(reading, q, unacked[q], unacked_bytes[q], by_queue.get(q, [])))
        vhosts[v.name] = {"lengths": shapes.counts(reading, [v], ready, waiting),
                          "message_stats": reading.with_rates([v], v.stats.totals(), VHOST_STATS, "msg_rates")}
    return {"queues": queues, "counted": counted, "vhosts": vhosts}


# A queue's figures in a report, packed small: its shapes.queue_values, the
# current rates of its lengths, and [total, rate] of each QUEUE_STATS counter
# or None (unpacked by `unpacked` into what shapes.queue_figures makes). Lists,
# not tuples: a shard link carries a tuple as an ext value of its own, at
# several times the cost (amqp_server.shards.codec).
LENGTH_DETAILS = ("messages_details", "messages_ready_details", "messages_unacknowledged_details")


def packed(reading, q, unacked: int, unacked_bytes: int, consumers: list) -> list:
    lengths = shapes.counts(reading, [q], q.message_count, unacked)
    stats = shapes.message_stats(reading, q, q.stats, QUEUE_STATS)
    return [shapes.queue_values(q, unacked, unacked_bytes, consumers),
            [lengths[key]["rate"] for key in LENGTH_DETAILS],
            None if stats is None else [[stats[key], stats[key + "_details"]["rate"]] for key in QUEUE_STATS]]


def unpacked(entry: list) -> dict:
    values, rates, counted = entry
    ready, unacked = values[2], values[3]
    lengths = {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked}
    lengths.update({key: {"rate": rate} for key, rate in zip(LENGTH_DETAILS, rates)})
    stats = None
    if counted is not None:
        stats = {}
        for key, (total, rate) in zip(QUEUE_STATS, counted):
            stats[key] = total
            stats[key + "_details"] = {"rate": rate}
    return shapes.figures_of(values, dict(sorted(lengths.items())), stats)


# -- merging ----------------------------------------------------------------------------


def add_figures(into: dict, other: dict) -> dict:
    """`into` plus `other`, key by key: counts add, and so do `_details`
    (`add_details`). A new dict; neither is changed."""
    out = dict(into)
    for key, value in other.items():
        mine = out.get(key)
        if isinstance(value, dict):
            out[key] = add_details(mine, value) if isinstance(mine, dict) else dict(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = (mine or 0) + value
    return out


def add_details(mine: dict, other: dict) -> dict:
    """Two `X_details` summed: the samples of one range (the same times on
    every shard: history.Range.times) add up, and the rates follow from
    them as history.details has them; without samples on both, the current
    rates add (the range's samples stay `mine`'s)."""
    ours, theirs = mine.get("samples"), other.get("samples")
    if ours is None or theirs is None or [s["timestamp"] for s in ours] != [s["timestamp"] for s in theirs]:
        out = dict(mine)
        out["rate"] = round(mine.get("rate", 0.0) + other.get("rate", 0.0), 1)
        return out
    samples = [a["sample"] + b["sample"] for a, b in zip(ours, theirs)]
    times = [a["timestamp"] for a in ours]
    out = {"samples": [{"sample": n, "timestamp": t} for n, t in zip(samples, times)], "rate": 0.0}
    if len(samples) >= 2:
        incr = (times[0] - times[1]) / 1000
        out["rate"] = (samples[0] - samples[1]) / incr
        out["avg"] = sum(samples) / len(samples)
        out["avg_rate"] = (samples[0] - samples[-1]) / ((len(samples) - 1) * incr)
    return out


class NodeQueues:
    """Every queue of the node as one request sees it: a queue this shard
    owns by its own figures, another shard's by that shard's report (or,
    when it reported none, as idle), and its message_stats summed over the
    shards that counted its messages. A queue of a shard that is not
    reporting (`silent`) is "down", with no figures, as RabbitMQ shows a
    queue whose node is down."""

    def __init__(self, node, reading, found=()) -> None:
        """`found`: the other shards' reports (`gathered`), with queues and counted."""
        self.node = node
        self.reading = reading
        held = holders(node)
        self.unacked = shapes.unacked_by_queue(held)
        self.unacked_bytes = shapes.unacked_bytes_by_queue(held)
        self.consumers = shapes.consumers_by_queue(node.connections)
        # (vhost, name) -> figures of another shard's queue: `packed` (a list), or whole (a dict, with a
        # range's samples)
        self.figures: dict = {}
        self.fresh: dict = {}  # (vhost, name) -> figures its owner just gave
        self.counted: dict = {}  # (vhost, name) -> [message_stats of other shards]
        self.down = silent(node)  # shards whose queues are down
        for _index, report in found:
            self.figures.update(report.get("queues", {}))
            for key, stats in report.get("counted", {}).items():
                self.counted.setdefault(key, []).append(stats)

    def is_down(self, q) -> bool:
        return getattr(q, "remote", False) and q.shard in self.down

    def figures_of(self, q) -> dict:
        """The queue's figures (a new dict); of a queue that is down, its state alone."""
        if self.is_down(q):
            return {"state": "down"}
        if not getattr(q, "remote", False):
            out = shapes.queue_figures(self.reading, q, self.unacked[q], self.unacked_bytes[q],
                                       self.consumers.get(q, []))
        else:
            key = (q.vhost, q.name)
            found = self.figures.get(key)
            if key in self.fresh:
                out = dict(self.fresh[key])
            else:
                out = (shapes.idle_queue_figures(self.reading) if found is None
                       else unpacked(found) if isinstance(found, list) else dict(found))
            if _counted(q.stats):  # messages counted here, on their way to the owner
                self._count(out, shapes.message_stats(self.reading, q, q.stats, QUEUE_STATS))
        for stats in self.counted.get((q.vhost, q.name), ()):
            self._count(out, stats)
        return out

    @staticmethod
    def _count(out: dict, stats: dict) -> None:
        out["message_stats"] = add_figures(out.get("message_stats", {}), stats)

    def row(self, v, q) -> dict:
        out = shapes.queue_declaration(q, v.policy_for("queue", q.name), v.operator_policy_for("queue", q.name))
        out.update(self.figures_of(q))
        if self.node.shards is not None:
            out["shard"] = getattr(q, "shard", self.node.shards.here)
            cluster = self.node.cluster
            if cluster is not None and cluster.shards:
                # RabbitMQ's quorum-queue fields: the node that leads the queue's shard, and its group
                group = cluster.shards[out["shard"]]
                if group["leader"]:
                    out["node"] = out["leader"] = "hutch@" + group["leader"]
                out["members"] = ["hutch@" + n["name"] for n in group["nodes"]]
        return out

    def consumer_count(self, q) -> int:
        if self.is_down(q):
            return 0
        if getattr(q, "remote", False):
            found = self.figures.get((q.vhost, q.name))
            if found is None:
                return 0
            return found[0][0] if isinstance(found, list) else found["consumers"]
        return q.consumer_count


def own_vhost_totals(reading, vhosts, unacked) -> tuple[dict, dict]:
    """(queue_totals, message_stats) of `vhosts` on this shard: the queues
    it owns, the messages it counted (`unacked`: its deliveries not acked,
    by queue: shapes.unacked_by_queue)."""
    own = [q for v in vhosts for q in v.queues.values() if not getattr(q, "remote", False)]
    lengths = shapes.counts(reading, vhosts, sum(q.message_count for q in own), sum(unacked[q] for q in own))
    totals = dict.fromkeys(VHOST_STATS, 0)
    for v in vhosts:
        for key, value in v.stats.totals().items():
            if key in totals:
                totals[key] += value
    return lengths, reading.with_rates(vhosts, totals, VHOST_STATS, "msg_rates")


def vhost_totals(reading, vhosts, unacked, found) -> tuple[dict, dict]:
    """(queue_totals, message_stats) of `vhosts` over the node (`found`: the
    other shards' reports, with vhosts)."""
    lengths, stats = own_vhost_totals(reading, vhosts, unacked)
    for _index, report in found:
        for v in vhosts:
            part = report["vhosts"].get(v.name)
            if part is not None:
                lengths = add_figures(lengths, part["lengths"])
                stats = add_figures(stats, part["message_stats"])
    return lengths, stats


def exchange_stats(found, vhost_name: str, name: str) -> list[dict]:
    """The message_stats other shards counted for an exchange (publishes that arrived there)."""
    return [report["exchanges"][(vhost_name, name)] for _index, report in found
            if (vhost_name, name) in report["exchanges"]]


# -- services: what shard 0 asks of the others ------------------------------------------------


# name -> handler(node, *args) -> answer (or an awaitable of it): what this shard
# answers for shard 0's management (ShardNode.services); each module of the
# face registers its own (`service`).
SERVICES: dict = {}


def service(name: str):
    """Register the decorated function as the service `name`."""
    def register(handler):
        SERVICES[name] = handler
        return handler
    return register


def attach(node, shards) -> None:
    """Make the management face of this shard (`node`) part of its node of
    several shards (`shards`: its ShardNode)."""
    node.shards = shards
    shards.report_source = lambda: report(node)
    shards.services.update({name: functools.partial(handler, node) for name, handler in SERVICES.items()})


def owned_queue(node, vhost: str, name: str):
    """(vhost, queue) of a queue this shard owns, or None (deleted meanwhile)."""
    v = node.broker.vhosts.get(vhost)
    q = v.queues.get(name) if v is not None else None
    return None if q is None or getattr(q, "remote", False) else (v, q)


@service("report")
def _report_service(node, parts: list, asked: dict) -> dict:
    return report(node, tuple(parts), asked)


@service("connection.close")
def _close_connection(node, name: str, reason: str) -> bool:
    for connection in list(node.connections):
        if connection.vhost is not None and shapes.connection_name(connection) == name:
            connection.close_with(AMQPError(CONNECTION_FORCED, reason))
            return True
    return False


@service("queue.figures")
def _queue_figures(node, vhost: str, name: str, asked: dict) -> dict | None:
    found = owned_queue(node, vhost, name)
    return None if found is None else NodeQueues(node, Reading.answering(node.sampler, asked)).figures_of(found[1])


async def at_owner(node, queue, service_name: str, *args):
    """The answer of `service_name` at the shard that owns `queue`; an
    AMQPError it raised is raised here; 503 when it ended first."""
    try:
        return await ask(node, queue.shard, service_name, *args)
    except AMQPError:
        raise
    except Exception as exc:  # the owner ended before it answered (ShardGone)
        raise unavailable(queue, exc) from None


def unavailable(queue, error: Exception) -> ApiError:
    """The 503 when the shard that owns `queue` ended before it answered
    (it is restarted; the request may be tried again)."""
    return ApiError(503, "service_unavailable", "queue '%s' in vhost '%s' is on shard %d, which did not answer: %s"
                    % (queue.name, queue.vhost, queue.shard, error))


async def ask(node, shard: int, service: str, *args):
    """The answer of another shard's service (the node's ShardNode.ask)."""
    return await node.shards.ask(shard, service, *args)


async def purged(node, queue) -> int:
    """Purge another shard's queue at its owner: the count purged (an
    AMQPError when the owner ended before it answered)."""
    future = asyncio.get_running_loop().create_future()
    node.shards.purge(queue, lambda result: future.done() or future.set_result(result))
    result = await future
    if isinstance(result, AMQPError):
        raise result
    return result


async def fresh_figures(node, q, reading) -> dict | None:
    """A queue's figures from its owner now (read as `reading` reads, with
    the samples of its ranges), or None when it does not answer within
    FRESH_WAIT."""
    try:
        return await asyncio.wait_for(ask(node, q.shard, "queue.figures", q.vhost, q.name, reading.asked()),
                                      FRESH_WAIT)
    except Exception:  # the owner ended, or is busy: the listing's reported figures will do
        return None
