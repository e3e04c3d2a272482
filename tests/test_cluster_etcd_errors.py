"""What the etcd wrapper (amqp_server.cluster.etcd.Etcd) makes of aetcd's
errors: a status aetcd has no class for (a member without quorum answers
UNKNOWN "context deadline exceeded") is etcd not answering, so callers that
retry on EtcdUnavailable (the lease keeper among them) go on retrying instead
of dying; an answer such as a failed precondition still reaches the caller.
The partition harness found the lease thread dead of the first (docs/cluster.md)."""
from __future__ import annotations

import asyncio

import aetcd.exceptions
import pytest

from amqp_server.cluster.etcd import Etcd, EtcdUnavailable


class _Member:
    """An etcd client whose every request fails with `error` (the wrapper's only collaborator)."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.closed = False

    async def connect(self) -> None:
        return None

    async def close(self) -> None:
        self.closed = True


def _failing(error: Exception):
    """An Etcd of one endpoint whose client fails every request with `error`."""
    etcd = Etcd(["http://127.0.0.1:1"], "hutch", 1.0)
    member = etcd._client = _Member(error)

    async def request(client):
        raise client.error

    return etcd, member, request


def test_an_unclassified_client_error_is_etcd_unavailable():
    etcd, member, request = _failing(aetcd.exceptions.ClientError("context deadline exceeded"))
    with pytest.raises(EtcdUnavailable, match="context deadline exceeded"):
        asyncio.run(etcd._call(request))
    assert member.closed  # the next call connects afresh


def test_an_answer_of_etcd_still_reaches_the_caller():
    etcd, member, request = _failing(aetcd.exceptions.PreconditionFailedError("no"))
    with pytest.raises(aetcd.exceptions.PreconditionFailedError):
        asyncio.run(etcd._call(request))
