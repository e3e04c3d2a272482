"""AMQPS: a TLS listener next to the plain one, with optional client
certificates (verify_peer / fail_if_no_peer_cert, as RabbitMQ's ssl_options).

A CA, a server certificate (localhost / 127.0.0.1) and client certificates —
one from that CA and one from an unrelated CA — are made at test time with the
`cryptography` package.
"""
from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from pathlib import Path

import pika
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pamqp import commands

from amqp_raw import PROTOCOL_HEADER, Closed, RawClient
from helpers import connect, unique


# -- certificates ---------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: str, key, issuer_name: x509.Name, issuer_key, *, ca: bool = False,
           usage=None, san=None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(directory: Path, stem: str, cert: x509.Certificate, key) -> tuple[str, str]:
    cert_path, key_path = directory / (stem + ".pem"), directory / (stem + ".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("pki")
    new_key = lambda: ec.generate_private_key(ec.SECP256R1())  # noqa: E731
    out = {}
    ca_key = new_key()
    ca = _issue("hutch test CA", ca_key, _name("hutch test CA"), ca_key, ca=True)
    out["ca"] = _write(directory, "ca", ca, ca_key)[0]
    server_key = new_key()
    server = _issue("localhost", server_key, ca.subject, ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH,
                    san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    out["server"] = _write(directory, "server", server, server_key)
    client_key = new_key()
    client = _issue("guest", client_key, ca.subject, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    out["client"] = _write(directory, "client", client, client_key)
    rogue_ca_key = new_key()
    rogue_ca = _issue("someone else's CA", rogue_ca_key, _name("someone else's CA"), rogue_ca_key, ca=True)
    rogue_key = new_key()
    rogue = _issue("guest", rogue_key, rogue_ca.subject, rogue_ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    out["rogue"] = _write(directory, "rogue", rogue, rogue_key)
    return out


def tls_broker(start_broker, pki: dict, *flags: str):
    certfile, keyfile = pki["server"]
    return start_broker("--tls-certfile", certfile, "--tls-keyfile", keyfile, "--tls-port", "0", *flags,
                        expect=("AMQP", "AMQPS"))


def client_context(pki: dict, cert: str | None = None) -> ssl.SSLContext:
    """Verifies the server against the test CA (and its name); presents `cert`."""
    context = ssl.create_default_context(cafile=pki["ca"])
    if cert:
        context.load_cert_chain(*pki[cert])
    return context


def connect_tls(port: int, context: ssl.SSLContext) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, ssl_options=pika.SSLOptions(context, server_hostname="localhost"),
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=5))


def round_trip(connection: pika.BlockingConnection) -> None:
    """Publish, consume and ack one message over `connection`, then close it."""
    try:
        channel = connection.channel()
        queue = channel.queue_declare(unique("tls"), exclusive=True).method.queue
        payload = b"over TLS " + bytes(range(256)) * 200
        channel.basic_publish("", queue, payload)
        for method, _, body in channel.consume(queue, inactivity_timeout=5):
            assert method is not None, "no delivery"
            assert body == payload
            channel.basic_ack(method.delivery_tag)
            break
        channel.cancel()
    finally:
        connection.close()


def assert_plain_port_serves(port: int) -> None:
    round_trip(connect(port))


def tls_start(port: int, context: ssl.SSLContext) -> commands.Connection.Start:
    """Raw: TLS handshake, protocol header, and the server's Connection.Start."""
    client = RawClient(port)
    client.sock = context.wrap_socket(client.sock, server_hostname="localhost")
    client.sock.settimeout(5)
    try:
        return client.handshake_start()
    finally:
        client.close()


# -- the listener -------------------------------------------------------------------


def test_amqps_listener_serves_pika_over_tls(start_broker, pki):
    broker = tls_broker(start_broker, pki)
    assert "listening for AMQPS on 127.0.0.1:%d" % broker.ports["AMQPS"] in broker.log
    assert broker.ports["AMQPS"] != broker.port
    round_trip(connect_tls(broker.ports["AMQPS"], client_context(pki)))
    assert_plain_port_serves(broker.port)


def test_tls_session_uses_the_configured_certificate(start_broker, pki):
    broker = tls_broker(start_broker, pki)
    context = client_context(pki)
    with socket.create_connection(("127.0.0.1", broker.ports["AMQPS"]), timeout=5) as plain:
        with context.wrap_socket(plain, server_hostname="localhost") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
            subject = dict(pair[0] for pair in tls.getpeercert()["subject"])
            assert subject["commonName"] == "localhost"
            tls.sendall(PROTOCOL_HEADER)
            assert tls.recv(7)[:1] == b"\x01"  # a method frame: Connection.Start


def test_plain_amqp_on_the_tls_port_gets_no_amqp_reply(start_broker, pki):
    broker = tls_broker(start_broker, pki)
    with socket.create_connection(("127.0.0.1", broker.ports["AMQPS"]), timeout=5) as sock:
        sock.sendall(PROTOCOL_HEADER)
        data = b""
        try:
            while chunk := sock.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
    assert data == b"" or data[0] == 0x15, data[:16]  # at most a TLS alert record, then closed
    assert_plain_port_serves(broker.port)


# -- client certificates ---------------------------------------------------------------


def refused(port: int, context: ssl.SSLContext) -> bool:
    """True when the broker does not let this TLS client get to Connection.Start."""
    try:
        tls_start(port, context)
    except (ssl.SSLError, Closed, ConnectionResetError, BrokenPipeError, socket.timeout):
        return True
    return False


def test_peer_verification_requires_a_certificate_from_the_ca(start_broker, pki):
    broker = tls_broker(start_broker, pki, "--tls-verify-peer", "true", "--tls-fail-if-no-peer-cert", "true",
                        "--tls-cacertfile", pki["ca"])
    port = broker.ports["AMQPS"]
    assert refused(port, client_context(pki))  # no certificate
    assert refused(port, client_context(pki, "rogue"))  # not signed by the CA
    assert isinstance(tls_start(port, client_context(pki, "client")), commands.Connection.Start)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect_tls(port, client_context(pki))
    round_trip(connect_tls(port, client_context(pki, "client")))
    assert_plain_port_serves(broker.port)


def test_peer_verification_without_fail_if_no_peer_cert(start_broker, pki):
    broker = tls_broker(start_broker, pki, "--tls-verify-peer", "true", "--tls-cacertfile", pki["ca"])
    port = broker.ports["AMQPS"]
    assert refused(port, client_context(pki, "rogue"))  # a certificate, if sent, must verify
    round_trip(connect_tls(port, client_context(pki)))  # but none is needed
    round_trip(connect_tls(port, client_context(pki, "client")))


def test_without_peer_verification_any_client_is_accepted(start_broker, pki):
    broker = tls_broker(start_broker, pki)
    port = broker.ports["AMQPS"]
    round_trip(connect_tls(port, client_context(pki)))
    round_trip(connect_tls(port, client_context(pki, "rogue")))
