"""The services a shard's parts share with the node (docs/scaling.md): its
reports to shard 0 (what the management API shows of it, every
REPORT_INTERVAL) and shard 0's latest of every other shard (`reports`), the
management services another shard may ask of it (`ask`, `services`), the
node's dead-letter log kept by shard 0 (amqp_server.shards.dead_letters),
the node-wide tallies (amqp_server.shards.tallies), and the records of the
definitions shard 0 orders (amqp_server.shards.definitions).
"""
from __future__ import annotations

import asyncio
import logging

from amqp_server.shards.mesh import ShardGone
from vhosts.errors import AMQPError

log = logging.getLogger("hutch.shards")

# Seconds between a shard's reports to shard 0 (what the management API shows of it).
REPORT_INTERVAL = 1.0


class Services:
    """Reports, services, dead letters, tallies and definitions (a part of
    ShardNode: amqp_server.shards.node)."""

    def __init__(self) -> None:
        # What this shard tells shard 0 of itself (its connections, its queues'
        # figures: the management face's rows, given by the composition root),
        # and shard 0's latest report of every other shard: shard -> (monotonic time, report).
        self.report_source = None
        self.reports: dict[int, tuple[float, object]] = {}
        # name -> handler(*args) -> answer (or an awaitable of it): requests another
        # shard's management may make of this one ("ask" records).
        self.services: dict[str, object] = {}

    async def _report(self) -> None:
        while True:
            link = self.peers.get(0)
            if link is not None and self.report_source is not None:
                try:
                    link.send(("report", self.here, self.report_source()))
                except Exception:
                    log.exception("shard %d: cannot make its report", self.here)
            await asyncio.sleep(REPORT_INTERVAL)

    def _on_report(self, link, index, report):
        self.reports[index] = (asyncio.get_running_loop().time(), report)

    async def ask(self, peer: int, service: str, *args):
        """The answer of `service` on shard `peer` (ShardGone if it ends first)."""
        future = asyncio.get_running_loop().create_future()

        def answered(record):
            if not future.done():
                if record[0] == "answer":
                    future.set_result(record[2])
                elif record[0] == "failed":
                    future.set_exception(AMQPError.from_reply(record[2], record[3]) if record[2]
                                         else RuntimeError(record[3]))
                else:
                    future.set_exception(ShardGone("shard %d ended before it answered" % peer))

        self.request(peer, lambda ticket: ("ask", ticket, service, args), answered)
        return await future

    def _on_ask(self, link, ticket, service, args):
        async def serve():
            try:
                answer = self.services[service](*args)
                if asyncio.iscoroutine(answer):
                    answer = await answer
            except AMQPError as exc:
                link.send(("failed", ticket, exc.reply_code, exc.reply_text))
                return
            except Exception as exc:
                log.exception("shard %d: %s failed", self.here, service)
                link.send(("failed", ticket, 0, str(exc)))
                return
            link.send(("answer", ticket, answer))

        self._spawn(serve())

    def _on_answer(self, link, ticket, answer):
        self._answered(ticket, ("answer", ticket, answer))

    def _on_failed(self, link, ticket, code, text):
        self._answered(ticket, ("failed", ticket, code, text))

    def _on_sync(self, link, ticket, offer):
        if link.peer is None:  # no shard's: it said no hello
            return
        self.definitions.adopt(link.peer, offer)
        changes, upto = self.definitions.synced_peer(link)
        link.send(("synced", ticket, changes, upto))

    def _on_synced(self, link, ticket, changes, upto):
        self._answered(ticket, ("synced", ticket, changes, upto))

    def _on_defined(self, link, ticket, result):
        self._answered(ticket, ("defined", ticket, result))

    def _on_refused(self, link, ticket, code, text):
        self._answered(ticket, ("refused", ticket, code, text))

    def _on_applied(self, link, ticket):
        self._answered(ticket, ("applied", ticket))

    def changed(self, change: tuple) -> None:
        self.definitions.changed(change)

    def nested(self):
        return self.definitions.nested()

    def _on_login(self, link, failed, host, username):
        self.tallies.login(failed, host, username)

    def tallied(self, kind: str, name: str, count: int) -> None:
        self.tallies.tallied(kind, name, count)

    def elsewhere(self, kind: str, name: str) -> int:
        return self.tallies.elsewhere(kind, name)

    def dead_letter(self, vhost: str, record, on_durable) -> None:
        def answered(answer):
            if answer[0] == "durable":
                on_durable()
            elif answered.link is not None:  # lost with its link, shard 0 may live: at least once
                self.dead_letter(vhost, record, on_durable)
            # Else no link to shard 0 came within shard_timeout: it ended, and the node restarts
            # with it; the message stays in its queue, as one never leaves before its record is on disk.

        self.request(0, lambda ticket: ("dead", ticket, vhost, record), answered)

    def _on_dead(self, link, ticket, vhost, record):
        host = self.broker.vhosts.get(vhost)
        storage = host.message_storage if host is not None else None
        log = storage.dead_letters if storage is not None else None
        if log is None:  # the vhost was deleted meanwhile, and its log with it
            link.send(("durable", ticket))
            return
        log.append(record, lambda: link.send(("durable", ticket)))
