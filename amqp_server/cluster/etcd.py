"""hutch's keys in etcd, through aetcd (an asyncio gRPC client for etcd's v3 API).

Keys, under the configured prefix (`hutch/` by default):
- `leader`: the leader's node name, attached to the leader's lease, so it
  disappears when the leader stops refreshing it; created only if absent
  (a transaction on its create revision), which is the election;
- `nodes/<name>`: each running node's JSON description (advertised host,
  ports, role), attached to that node's lease: the membership;
- `in_sync`: the JSON list of the nodes that hold every change the leader
  confirmed (the leader first). Written only by the leader, in a transaction
  that checks it still is the leader; only a node on that list may be
  elected. Absent in a new cluster: then any node may be.
- `members/<name>`: every node that ever joined (no lease: it stays while
  the node is stopped) until `hutchctl forget_cluster_node` removes it;
- `transfer`: the node a planned hand-over (`hutchctl transfer_leadership`)
  is for, on a short lease: while it exists only that node campaigns;
- `positions/<name>`: posted by each running node while there is no
  leader, on its lease: JSON {"term": the lease id of the leader whose
  replication stream it followed, "position": the byte offset in that
  stream its data directory holds, applied and synced}, both null when it
  does not know (a restarted process). Eligible nodes compare them so that
  the most complete one campaigns (amqp_server.cluster.node).

Every call has a timeout; a node that cannot reach any of the URLs raises
`EtcdUnavailable`, and `connect` keeps trying (logging why) until one answers.
"""
from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse

import aetcd

log = logging.getLogger("hutch.cluster")

RETRY_SECONDS = 1.0


class EtcdUnavailable(Exception):
    """No etcd endpoint answered."""


class Etcd:
    def __init__(self, urls: list[str], prefix: str, timeout: float) -> None:
        self.endpoints = [(u.hostname, u.port) for u in map(urllib.parse.urlsplit, urls)]
        self.prefix = prefix.strip("/").encode() + b"/"
        self.timeout = timeout
        self._client: aetcd.Client | None = None
        self._next = 0  # the endpoint to try next

    def key(self, *parts: str) -> bytes:
        return self.prefix + "/".join(parts).encode()

    # -- connection ----------------------------------------------------------

    async def connect(self) -> None:
        """Until some endpoint answers; says why not every few attempts."""
        attempts = 0
        while True:
            try:
                await self._call(lambda c: c.status())
                host, port = self.endpoints[(self._next - 1) % len(self.endpoints)]
                log.info("etcd reached at http://%s:%d", host, port)
                return
            except EtcdUnavailable as exc:
                if attempts % 10 == 0:
                    log.warning("cannot reach etcd (%s): %s; retrying", self.urls(), exc)
                attempts += 1
                await asyncio.sleep(RETRY_SECONDS)

    def urls(self) -> str:
        return ", ".join("http://%s:%d" % e for e in self.endpoints)

    async def _call(self, request):
        """`request(client)` on the current endpoint, or on the next ones when
        it fails to answer; EtcdUnavailable when none does."""
        problem = None
        for _ in range(len(self.endpoints)):
            if self._client is None:
                host, port = self.endpoints[self._next % len(self.endpoints)]
                self._next += 1
                self._client = aetcd.Client(host=host, port=port, timeout=self.timeout,
                                            connect_wait_timeout=max(1, int(self.timeout)))
            try:
                return await asyncio.wait_for(request(self._client), self.timeout)
            except (aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError, aetcd.InternalError,
                    asyncio.TimeoutError, OSError) as exc:
                problem = exc
                await self._drop()
        raise EtcdUnavailable(str(problem) or type(problem).__name__)

    async def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.close()
            except Exception:  # noqa: BLE001 - a broken channel may fail to close
                pass

    async def close(self) -> None:
        await self._drop()

    # -- leases ---------------------------------------------------------------

    async def grant(self, ttl: int) -> int:
        lease = await self._call(lambda c: c.lease(ttl))
        return lease.id

    async def refresh(self, lease_id: int) -> bool:
        """False when etcd no longer knows the lease (it ran out)."""
        reply = await self._call(lambda c: c.refresh_lease(lease_id))
        return reply.TTL > 0

    async def revoke(self, lease_id: int) -> None:
        await self._call(lambda c: c.revoke_lease(lease_id))

    # -- election and membership ---------------------------------------------

    async def campaign(self, name: str, lease_id: int) -> bool:
        """Become the leader if there is none; True when this node now is."""
        key = self.key("leader")

        async def txn(c):
            ok, _ = await c.transaction(compare=[c.transactions.create(key) == 0],
                                        success=[c.transactions.put(key, name.encode(), lease=lease_id)],
                                        failure=[])
            return ok

        return await self._call(txn)

    async def leader(self) -> str | None:
        got = await self._call(lambda c: c.get(self.key("leader")))
        return got.value.decode() if got is not None else None

    async def leader_term(self) -> int | None:
        """The revision at which the current `leader` key was created: it
        grows with every election (the leader's term, a fencing token)."""
        got = await self._call(lambda c: c.get(self.key("leader")))
        return got.create_revision if got is not None else None

    async def resign(self, name: str) -> bool:
        """Delete the leader key if `name` holds it (a planned hand-over)."""
        key = self.key("leader")

        async def txn(c):
            ok, _ = await c.transaction(compare=[c.transactions.value(key) == name.encode()],
                                        success=[c.transactions.delete(key)], failure=[])
            return ok

        return await self._call(txn)

    async def register(self, name: str, info: dict, lease_id: int) -> None:
        value = json.dumps(info).encode()
        await self._call(lambda c: c.put(self.key("nodes", name), value, lease=lease_id))
        await self._call(lambda c: c.put(self.key("members", name), value))

    async def _folder(self, folder: str) -> dict[str, dict]:
        """Every `<folder>/<name>` key: {name: its JSON value}."""
        prefix = self.key(folder, "")
        got = await self._call(lambda c: c.get_prefix(prefix))
        return {kv.key[len(prefix):].decode(): json.loads(kv.value) for kv in got}

    async def members(self) -> dict[str, dict]:
        return await self._folder("members")

    async def transfer_to(self) -> str | None:
        got = await self._call(lambda c: c.get(self.key("transfer")))
        return got.value.decode() if got is not None else None

    async def set_transfer(self, name: str, ttl: int) -> None:
        lease = await self._call(lambda c: c.lease(ttl))
        await self._call(lambda c: c.put(self.key("transfer"), name.encode(), lease=lease.id))

    async def clear_transfer(self) -> None:
        await self._call(lambda c: c.delete(self.key("transfer")))

    async def nodes(self) -> dict[str, dict]:
        return await self._folder("nodes")

    async def post_position(self, name: str, value: dict, lease_id: int) -> None:
        await self._call(lambda c: c.put(self.key("positions", name), json.dumps(value).encode(), lease=lease_id))

    async def withdraw_position(self, name: str) -> None:
        await self._call(lambda c: c.delete(self.key("positions", name)))

    async def positions(self) -> dict[str, dict]:
        return await self._folder("positions")

    async def in_sync(self) -> list[str] | None:
        got = await self._call(lambda c: c.get(self.key("in_sync")))
        return json.loads(got.value) if got is not None else None

    async def set_in_sync(self, leader: str, names: list[str]) -> bool:
        """Record the in-sync set; only while `leader` still holds the leader key."""
        leader_key, key = self.key("leader"), self.key("in_sync")
        value = json.dumps(names).encode()

        async def txn(c):
            ok, _ = await c.transaction(compare=[c.transactions.value(leader_key) == leader.encode()],
                                        success=[c.transactions.put(key, value)], failure=[])
            return ok

        return await self._call(txn)

    async def forget(self, leader: str, name: str) -> None:
        """Remove a stopped node from the members and the in-sync set."""
        names = await self.in_sync()
        if names is not None and name in names:
            names.remove(name)
            await self.set_in_sync(leader, names)
        await self._call(lambda c: c.delete(self.key("members", name)))
