"""MQTT over TLS (8883, `mqtt.tls_port`) with the broker's TLS settings."""
from __future__ import annotations

import aiomqtt

from helpers import unique
from test_mqtt_pubsub import next_message
from test_tls import client_context, pki  # noqa: F401 - pki is a fixture


async def test_mqtt_over_tls(start_broker, pki):  # noqa: F811
    certfile, keyfile = pki["server"]
    broker = start_broker("--tls-certfile", certfile, "--tls-keyfile", keyfile, "--tls-port", "0",
                          expect=("AMQP", "AMQPS", "MQTT", "MQTTS"))
    topic = unique("secure")
    context = client_context(pki)
    async with aiomqtt.Client("localhost", broker.ports["MQTTS"], identifier=unique("tls"),
                              tls_context=context) as secure, \
            aiomqtt.Client("127.0.0.1", broker.ports["MQTT"], identifier=unique("plain")) as plain:
        await secure.subscribe(topic, qos=1)
        await plain.publish(topic, b"to the TLS client", qos=1)
        assert (await next_message(secure)).payload == b"to the TLS client"


def test_without_tls_settings_there_is_no_mqtts_listener(start_broker):
    broker = start_broker(expect=("AMQP", "MQTT", "HTTP"))  # HTTP is logged after every protocol listener
    assert "MQTTS" not in broker.ports
