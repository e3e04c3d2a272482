"""Who may use a leader's replication port: a challenge-response on the
cluster secret (`cluster.secret`), both ways, before anything else crosses.

On a fresh connection to the leader's replication port (frames as in
amqp_server.cluster.stream, JSON bodies of at most HANDSHAKE_MAX bytes):

    leader -> CHALLENGE {"nonce": a}
    dialer -> HELLO     {"name", "purpose", "protocol", "client", "nonce": b,
                         "proof": HMAC(secret, ["hello", a, b, name, purpose, protocol, client])}
    leader -> WELCOME   {"term", "proof": HMAC(secret, ["welcome", a, b, name, purpose, term])}
           or REFUSED   {"reason"}, and closes

HMAC is HMAC-SHA256 (hex) over the compact JSON text of the list. `purpose`
is "replicate" (the follower's stream follows: LISTING, ...), "forward"
(a client's connection to a follower, `protocol` the leader's listener it
was made to, `client` its [host, port]: the leader serves it under that
address, as the PROXY protocol's header would say) or "link" (the link
between two shard leaders, amqp_server.shards.link; `protocol` is the
dialing shard's index, in decimal: docs/scaling.md).

Invariants:
- nothing of value (a data file, a client's bytes, an acknowledgement that
  counts towards a confirm) crosses before both ends proved they hold the
  secret, and the leader found `name` among etcd's running members;
- the secret never crosses the wire: each proof is an HMAC of both ends'
  fresh nonces, so a recorded exchange cannot be replayed;
- the claimed client address, the purpose and the leader's term are inside
  the proofs: nobody on the path can change them;
- the whole exchange ends within HANDSHAKE_SECONDS, or the connection is
  closed (a silent, half-open or slow peer holds nothing for long).
After WELCOME the connection belongs to its purpose; a replication stream
continues in TLS when `cluster.tls_*` is set (`server_context`,
`client_context`: mutual TLS, each end verifies the other's certificate
against the cluster's CA).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import socket
import ssl

from amqp_server.cluster.stream import CHALLENGE, HELLO, REFUSED, WELCOME, control
from storage.replica import HEAD

HANDSHAKE_MAX = 16 * 1024  # bytes of one handshake frame's body
HANDSHAKE_SECONDS = 5.0
PURPOSES = ("replicate", "forward", "link")


class HandshakeError(ConnectionError):
    """The other end failed the handshake; the message says how."""


class Refused(HandshakeError):
    """The leader refused this node; the message is its reason."""


def proof(secret: bytes, *parts) -> str:
    return hmac.new(secret, json.dumps(parts, separators=(",", ":")).encode(), hashlib.sha256).hexdigest()


async def _exactly(loop, sock: socket.socket, count: int) -> bytes:
    """`count` bytes and not one more: what follows belongs to the purpose."""
    data = bytearray()
    while len(data) < count:
        chunk = await loop.sock_recv(sock, count - len(data))
        if not chunk:
            raise HandshakeError("the connection closed during the handshake")
        data += chunk
    return bytes(data)


async def _read(loop, sock: socket.socket, expected: tuple[int, ...]) -> tuple[int, dict]:
    size, kind = HEAD.unpack(await _exactly(loop, sock, HEAD.size))
    if kind not in expected:
        raise HandshakeError("not a hutch replication handshake (record kind %d)" % kind)
    if size > HANDSHAKE_MAX:
        raise HandshakeError("handshake record of %d bytes: more than %d" % (size, HANDSHAKE_MAX))
    try:
        value = json.loads(await _exactly(loop, sock, size))
    except ValueError:
        raise HandshakeError("handshake record is not JSON") from None
    if not isinstance(value, dict):
        raise HandshakeError("handshake record is not a JSON object")
    return kind, value


def _text(value: dict, key: str, limit: int = 200) -> str:
    got = value.get(key)
    if not isinstance(got, str) or not got or len(got) > limit:
        raise HandshakeError("handshake field %r missing or malformed" % key)
    return got


async def admit(loop, sock: socket.socket, secret: bytes, term: int, is_member) -> dict:
    """The leader's end: the HELLO of a member that proved it holds the
    secret, once WELCOME is sent; HandshakeError (REFUSED sent) otherwise."""
    ours = secrets.token_hex(16)
    await loop.sock_sendall(sock, control(CHALLENGE, {"nonce": ours}))
    _kind, hello = await _read(loop, sock, (HELLO,))
    name, theirs, claimed = _text(hello, "name", 100), _text(hello, "nonce", 64), _text(hello, "proof", 64)
    purpose, protocol, client = hello.get("purpose"), hello.get("protocol"), hello.get("client")
    if purpose not in PURPOSES or not (protocol is None or isinstance(protocol, str) and len(protocol) < 32) or \
            not (client is None or isinstance(client, list) and len(client) == 2 and isinstance(client[0], str)
                 and isinstance(client[1], int)):
        raise HandshakeError("handshake fields malformed")
    if purpose == "forward" and (protocol is None or client is None):
        raise HandshakeError("a forwarded connection without its protocol or client address")
    if purpose == "link" and not (isinstance(protocol, str) and protocol.isdecimal() and protocol.isascii()):
        raise HandshakeError("a shard link without the index of its shard")
    if not hmac.compare_digest(claimed, proof(secret, "hello", ours, theirs, name, purpose, protocol, client)):
        await _refuse(loop, sock, "authentication failed: %s does not hold this cluster's secret" % name)
    if not await is_member(name):
        await _refuse(loop, sock, "%s is not a running member of this cluster (no nodes/%s in etcd)" % (name, name))
    await loop.sock_sendall(sock, control(WELCOME, {"term": term, "proof": proof(secret, "welcome", ours, theirs, name,
                                                                                   purpose, term)}))
    return hello


async def _refuse(loop, sock: socket.socket, reason: str) -> None:
    try:
        await loop.sock_sendall(sock, control(REFUSED, {"reason": reason}))
    except OSError:
        pass
    raise HandshakeError(reason)


async def introduce(loop, sock: socket.socket, secret: bytes, name: str, purpose: str, protocol: str | None = None,
                    client: list | None = None) -> int:
    """The dialer's end: the leader's term, once it proved it holds the secret."""
    _kind, challenge = await _read(loop, sock, (CHALLENGE,))
    theirs, ours = _text(challenge, "nonce", 64), secrets.token_hex(16)
    await loop.sock_sendall(sock, control(HELLO, {
        "name": name, "purpose": purpose, "protocol": protocol, "client": client, "nonce": ours,
        "proof": proof(secret, "hello", theirs, ours, name, purpose, protocol, client)}))
    kind, answer = await _read(loop, sock, (WELCOME, REFUSED))
    if kind == REFUSED:
        raise Refused(str(answer.get("reason")))
    term = answer.get("term")
    if not isinstance(term, int) or not isinstance(answer.get("proof"), str) or not hmac.compare_digest(
            answer["proof"], proof(secret, "welcome", theirs, ours, name, purpose, term)):
        raise HandshakeError("the leader did not prove it holds this cluster's secret")
    return term


async def dial(host: str, port: int, secret: bytes, name: str, purpose: str, protocol: str | None = None,
               client: list | None = None) -> tuple[socket.socket, int]:
    """Connect to a leader's replication port and introduce this node:
    (the connected socket, the leader's term)."""
    loop = asyncio.get_running_loop()

    async def connect() -> tuple[socket.socket, int]:
        problem: OSError = OSError("%s: no address" % host)
        for family, kind, proto, _name, address in await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, address)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock, await introduce(loop, sock, secret, name, purpose, protocol, client)
            except HandshakeError:
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                problem = exc  # the next address, if any
            except BaseException:  # cancelled (the timeout)
                sock.close()
                raise
        raise problem

    try:
        return await asyncio.wait_for(connect(), HANDSHAKE_SECONDS)
    except asyncio.TimeoutError:
        raise HandshakeError("no handshake with %s:%d within %.0f s" % (host, port, HANDSHAKE_SECONDS)) from None


def server_context(cluster) -> ssl.SSLContext | None:
    """The leader's end of a replication stream's TLS, or None without it."""
    if not cluster.tls_certfile:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=cluster.tls_cacertfile)
    context.load_cert_chain(cluster.tls_certfile, cluster.tls_keyfile)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(cluster) -> ssl.SSLContext | None:
    """The follower's end. Host names are not checked: a member is whoever
    holds a certificate of the cluster's own CA (docs/cluster.md)."""
    if not cluster.tls_certfile:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cluster.tls_cacertfile)
    context.load_cert_chain(cluster.tls_certfile, cluster.tls_keyfile)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    return context
