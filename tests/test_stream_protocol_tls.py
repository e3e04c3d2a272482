"""The stream protocol over TLS (stream.tls_port, with the tls section's
certificate): rstream publishes and consumes, and SASL EXTERNAL logs in as
the client certificate's common name when peers are verified."""
from __future__ import annotations

from rstream import AMQPMessage, ConsumerOffsetSpecification, OffsetType, Producer, SlasMechanism

from helpers import unique
from stream_scenarios import until
from test_tls import client_context, pki  # noqa: F401 - pki is a fixture

FIRST = ConsumerOffsetSpecification(OffsetType.FIRST, None)


def tls_stream_broker(start_broker, pki, *flags: str):  # noqa: F811
    certfile, keyfile = pki["server"]
    return start_broker("--tls-certfile", certfile, "--tls-keyfile", keyfile, "--tls-port", "0", *flags,
                        expect=("AMQP", "STREAM", "STREAMS"))


async def round_trip(port: int, context, **credentials) -> list[bytes]:
    from rstream import Consumer, amqp_decoder
    stream = unique("tls")
    async with Producer("127.0.0.1", port=port, ssl_context=context, **credentials) as p:
        await p.create_stream(stream)
        await p.send_wait(stream, AMQPMessage(body=b"over tls"))
    got = []
    c = Consumer("127.0.0.1", port=port, ssl_context=context, **credentials)
    await c.start()

    async def on_message(message, context_) -> None:
        got.append(bytes(message.body))
    await c.subscribe(stream, on_message, decoder=amqp_decoder, offset_specification=FIRST)
    await until(lambda: got, what="the message over TLS")
    await c.close()
    return got


async def test_stream_over_tls(start_broker, pki):  # noqa: F811
    broker = tls_stream_broker(start_broker, pki)
    assert await round_trip(broker.ports["STREAMS"], client_context(pki), username="guest",
                            password="guest") == [b"over tls"]


async def test_sasl_external_with_a_client_certificate(start_broker, pki):  # noqa: F811
    broker = tls_stream_broker(start_broker, pki, "--tls-cacertfile", pki["ca"], "--tls-verify-peer", "true")
    got = await round_trip(broker.ports["STREAMS"], client_context(pki, "client"), username="", password="",
                           sasl_configuration_mechanism=SlasMechanism.MechanismExternal)
    assert got == [b"over tls"]
