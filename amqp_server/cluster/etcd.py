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
  leader, on its lease: JSON {"cluster": its data directory's cluster
  identity, "term", "position": the term of the stream its data directory
  holds and how far (amqp_server.cluster.state; null: unknown), "data":
  whether the directory holds anything}. Nodes compare them so that the
  most complete one campaigns (amqp_server.cluster.node).
- `cluster`: JSON {"id": the cluster identity, "term": the current
  leader's term}, written with `leader` by the winning campaign (the terms
  count elections: each leader's is one more than any seen before).
- `shards/count`: how many shards every node runs, written by the first
  node to start (a node of another count refuses to start); shard K > 0's
  replication group keeps the keys above under `shards/K/`
  (docs/scaling.md).

Every call has a timeout; a node that cannot reach any of the URLs raises
`EtcdUnavailable`, and `connect` keeps trying (logging why) until one answers.
With `https://` URLs the connection is TLS (cluster.etcd_cacert, and
etcd_cert/etcd_key for a client certificate); with cluster.etcd_user the
node authenticates (aetcd's user and password login).
"""
from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse

import aetcd
import grpc
from aetcd import rpc, watcher

log = logging.getLogger("hutch.cluster")

RETRY_SECONDS = 1.0
CONNECT_SECONDS = 5.0


class EtcdUnavailable(Exception):
    """No etcd endpoint answered."""


class Client(aetcd.Client):
    """aetcd's client, its connection steps aetcd 1.0's but for two: over a
    TLS channel (grpc's own credentials) when `credentials` are given (aetcd
    opens plaintext channels only), and the login given CONNECT_SECONDS
    rather than a request's timeout (etcd checks a bcrypt hash)."""

    def __init__(self, *args, credentials: grpc.ChannelCredentials | None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target, options = "%s:%d" % (self._host, self._port), list(self._options.items())
            self.channel = rpc.insecure_channel(target, options=options) if self._credentials is None else \
                rpc.secure_channel(target, self._credentials, options=options)
            if self._username is not None:
                try:
                    reply = await rpc.AuthStub(self.channel).Authenticate(
                        rpc.AuthenticateRequest(name=self._username, password=self._password),
                        timeout=max(self._timeout or 0, CONNECT_SECONDS))
                except rpc.AioRpcError as exc:
                    aetcd.exceptions._handle_exception(exc)
                self.metadata = (("token", reply.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout,
                                            metadata=self.metadata)
            self._connected.set()
        finally:
            self._is_connecting = False


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


class Etcd:
    def __init__(self, urls: list[str], prefix: str, timeout: float, cacert: str | None = None,
                 cert: str | None = None, key: str | None = None, user: str | None = None,
                 password: str | None = None) -> None:
        parts = list(map(urllib.parse.urlsplit, urls))
        self.endpoints = [(u.hostname, u.port) for u in parts]
        self.scheme = parts[0].scheme if parts else "http"
        self.prefix = prefix.strip("/").encode() + b"/"
        self.timeout = timeout
        self.user, self.password = user, password
        self.credentials = None
        if self.scheme == "https":  # files read once, at start: a missing one is refused then
            self.credentials = grpc.ssl_channel_credentials(_read(cacert), _read(key), _read(cert))
        self._client: aetcd.Client | None = None
        self._next = 0  # the endpoint to try next

    @classmethod
    def configured(cls, cluster, timeout: float) -> "Etcd":
        """For the `cluster` settings (amqp_server.config.ClusterConfig)."""
        return cls(cluster.etcd, cluster.etcd_prefix, timeout, cluster.etcd_cacert, cluster.etcd_cert,
                   cluster.etcd_key, cluster.etcd_user, cluster.etcd_password)

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
                log.info("etcd reached at %s://%s:%d", self.scheme, host, port)
                return
            except EtcdUnavailable as exc:
                if attempts % 10 == 0:
                    log.warning("cannot reach etcd (%s): %s; retrying", self.urls(), exc)
                attempts += 1
                await asyncio.sleep(RETRY_SECONDS)

    def urls(self) -> str:
        return ", ".join("%s://%s:%d" % (self.scheme, *e) for e in self.endpoints)

    async def _call(self, request):
        """`request(client)` on the current endpoint, or on the next ones when
        it fails to answer; EtcdUnavailable when none does."""
        problem = None
        for _ in range(len(self.endpoints)):
            if self._client is None:
                host, port = self.endpoints[self._next % len(self.endpoints)]
                self._next += 1
                settings = dict(host=host, port=port, username=self.user, password=self.password,
                                timeout=self.timeout, connect_wait_timeout=max(1, int(self.timeout)))
                self._client = Client(credentials=self.credentials, **settings)
            try:
                # a TLS handshake and a login may take longer than a request
                await asyncio.wait_for(self._client.connect(), max(self.timeout, CONNECT_SECONDS))
                return await asyncio.wait_for(request(self._client), self.timeout)
            except (aetcd.exceptions.UnauthenticatedError, aetcd.exceptions.InvalidArgumentError) as exc:
                # a wrong user or password, or an expired token (a new connection logs in again)
                if isinstance(exc, aetcd.exceptions.InvalidArgumentError) and "authentication failed" not in str(exc):
                    raise
                problem = "etcd refused the login of user %r: %s" % (self.user, exc) if self.user else exc
                await self._drop()
            except (aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError, aetcd.InternalError,
                    grpc.aio.AioRpcError, asyncio.TimeoutError, OSError) as exc:
                problem = exc
                await self._drop()
            except aetcd.exceptions.ClientError as exc:
                # aetcd's bare ClientError wraps a status it has no class for, such as the UNKNOWN
                # "context deadline exceeded" of a member without quorum: etcd did not answer.
                # Its subclasses (a failed precondition, a compacted revision...) are answers.
                if type(exc) is not aetcd.exceptions.ClientError:
                    raise
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

    async def cluster(self) -> tuple[dict | None, bytes | None]:
        """The cluster's record {"id", "term"} and its stored bytes (None, None: absent)."""
        got = await self._call(lambda c: c.get(self.key("cluster")))
        if got is None:
            return None, None
        try:
            record = json.loads(got.value)
            return {"id": str(record["id"]), "term": int(record["term"])}, got.value
        except (ValueError, KeyError, TypeError):
            return {"id": None, "term": 0}, got.value  # not hutch's: treated as another cluster's

    async def campaign(self, name: str, lease_id: int, seen: bytes | None, record: dict) -> bool:
        """Become the leader if there is none and the cluster's record is still
        `seen` (the bytes read; None: absent), writing `record` with the leader
        key; True when this node now leads."""
        key, cluster = self.key("leader"), self.key("cluster")

        async def txn(c):
            unchanged = c.transactions.create(cluster) == 0 if seen is None else c.transactions.value(cluster) == seen
            ok, _ = await c.transaction(compare=[c.transactions.create(key) == 0, unchanged],
                                        success=[c.transactions.put(key, name.encode(), lease=lease_id),
                                                 c.transactions.put(cluster, json.dumps(record).encode())],
                                        failure=[])
            return ok

        return await self._call(txn)

    async def agree_shards(self, count: int) -> int:
        """The number of shards every node of the cluster runs: `count` if
        this is the first node to say (`shards`, kept for good), else what the first said."""
        key = self.key("shards", "count")

        async def txn(c):
            await c.transaction(compare=[c.transactions.create(key) == 0],
                                success=[c.transactions.put(key, str(count).encode())], failure=[])
            return int((await c.get(key)).value)

        return await self._call(txn)

    async def registered(self, name: str) -> bool:
        return await self._call(lambda c: c.get(self.key("nodes", name))) is not None

    async def leader(self) -> str | None:
        got = await self._call(lambda c: c.get(self.key("leader")))
        return got.value.decode() if got is not None else None

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
