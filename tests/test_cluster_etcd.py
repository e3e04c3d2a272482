"""The cluster and its etcd (tests/cluster_kit.py: real etcd, real hutch
processes): etcd over TLS with a client certificate and a user login; an
etcd outage of a few seconds restarts no node, a longer one leaves the
cluster unavailable but intact, and it recovers by itself."""
from __future__ import annotations

import asyncio
import urllib.parse

import grpc
import pika
import pytest
from aetcd import rpc

from cluster_kit import EtcdProcess, Load, in_sync, make_nodes, print_logs, running, until
from test_tls import pki  # noqa: F401 - a CA, a server certificate for 127.0.0.1, a client certificate

pytestmark = pytest.mark.timeout(240)

USER, PASSWORD = "hutch", "s3cret"


def credentials(pki) -> grpc.ChannelCredentials:
    read = lambda path: open(path, "rb").read()  # noqa: E731
    return grpc.ssl_channel_credentials(read(pki["ca"]), read(pki["client"][1]), read(pki["client"][0]))


def enable_auth(etcd: EtcdProcess, pki) -> None:
    """etcd's `user add`, `role add`, `grant-permission` (hutch's prefix) and
    `auth enable`, over gRPC (Debian's etcd-server has no etcdctl)."""
    async def setup():
        async with grpc.aio.secure_channel("127.0.0.1:%d" % etcd.client_port, credentials(pki)) as channel:
            auth = rpc.AuthStub(channel)
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"))
            await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password="root-password"))
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"))
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name=USER))
            await auth.RoleGrantPermission(rpc.AuthRoleGrantPermissionRequest(
                name=USER, perm=rpc.Permission(permType=rpc.Permission.READWRITE, key=b"hutch/", range_end=b"hutch0")))
            await auth.UserAdd(rpc.AuthUserAddRequest(name=USER, password=PASSWORD))
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=USER, role=USER))
            await auth.AuthEnable(rpc.AuthEnableRequest())

    asyncio.run(setup())


def leader_over_tls(etcd: EtcdProcess, pki) -> bytes | None:
    async def get():
        async with grpc.aio.secure_channel("127.0.0.1:%d" % etcd.client_port, credentials(pki)) as channel:
            token = (await rpc.AuthStub(channel).Authenticate(
                rpc.AuthenticateRequest(name=USER, password=PASSWORD))).token
            reply = await rpc.KVStub(channel).Range(rpc.RangeRequest(key=b"hutch/leader"),
                                                   metadata=(("token", token),))
            return reply.kvs[0].value if reply.kvs else None

    return asyncio.run(get())


def test_a_node_reaches_etcd_over_tls_with_a_client_certificate_and_a_login(tmp_path, pki):  # noqa: F811
    etcd = EtcdProcess(tmp_path, tls={"cert": pki["server"][0], "key": pki["server"][1], "ca": pki["ca"]}).start()
    assert urllib.parse.urlsplit(etcd.url).scheme == "https"
    enable_auth(etcd, pki)
    tls = ("--cluster-etcd-cacert", pki["ca"], "--cluster-etcd-cert", pki["client"][0],
           "--cluster-etcd-key", pki["client"][1], "--cluster-etcd-user", USER)
    (refused,) = make_nodes(tmp_path / "refused", etcd.url, 1, *tls, "--cluster-etcd-password", "wrong")
    (node,) = make_nodes(tmp_path, etcd.url, 1, *tls, "--cluster-etcd-password", PASSWORD)
    try:
        refused.start()
        until(lambda: "etcd refused the login of user 'hutch'" in refused.log, 30, "the wrong password refused")
        refused.stop()
        node.start()
        until(lambda: leader_over_tls(etcd, pki) == b"n1", 60, "the node to lead through etcd over TLS")
        until(node.serving, 30, "it to serve")
        with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("over-tls", durable=True)
            channel.basic_publish("", "over-tls", b"m", pika.BasicProperties(delivery_mode=2))
        assert "etcd reached at https://127.0.0.1:%d" % etcd.client_port in node.log
    finally:
        refused.stop()
        node.stop()
        etcd.stop()
        print_logs([refused, node])


def test_an_etcd_outage_restarts_no_node_and_a_long_one_is_survived(tmp_path):
    """etcd stopped for a few seconds (past every lease's deadline) under
    confirmed load: no node restarts, confirms wait and resume when etcd is
    back. Then etcd stopped for longer than a leader waits (lease_ttl x 3
    past its deadline): the leader gives up leading, the followers stay up,
    and once etcd is back the cluster forms again by itself; nothing
    confirmed is lost."""
    with running(tmp_path, 3) as (etcd, nodes):
        load = Load([n.url for n in nodes]).start()
        load.progress(200, 30, "confirms before the outage")
        port = etcd.client_port
        etcd.stop()
        until(lambda: all("the etcd lease's deadline passed" in n.log for n in nodes), 30,
              "every node past its lease's deadline")
        etcd.start()  # the same data directory and port: etcd restarted, its leases extended
        load.progress(200, 60, "confirms after a short outage")
        assert not any("stopping at once" in n.log for n in nodes), "a node restarted for a short etcd outage"
        assert all(n.log.count("---- start\n") == 1 for n in nodes)  # not "---- start alone" (seed)

        etcd.stop()
        until(lambda: any("stopping at once" in n.log for n in nodes), 60, "the leader to give up")
        stopped = next(n for n in nodes if "stopping at once" in n.log)
        assert sum("stopping at once" in n.log for n in nodes) == 1, "a follower restarted"
        assert etcd.client_port == port
        etcd.start()
        until(lambda: len(in_sync(etcd)) == 3, 90, "the cluster to form again")
        load.progress(200, 90, "confirms after a long outage")
        lost, _duplicates = load.finish(60)
        assert not lost, "%d confirmed messages lost" % len(lost)
        assert "the etcd lease ran out" in stopped.log
