"""The stream protocol, differential against RabbitMQ 3.10.8's rabbitmq_stream
plugin (port 5552; tests/prepare.sh enables it): the same scenarios
(tests/stream_scenarios.py) observe the same on both brokers.

Only what RabbitMQ 3.10 has is compared: publish and confirm, the offset
specifications, deduplication, stored offsets, the errors of stream
commands, and over a raw socket the response codes of bad requests (SASL,
vhost, unknown publisher and subscription, missing streams, metadata).
Super streams and single active consumer (3.11), filtering (3.13) and exact
timestamps per message are hutch-only (tests/test_stream_protocol.py).
Without RabbitMQ's stream port the tests skip, except in CI, where they fail.
"""
from __future__ import annotations

import asyncio
import os
import socket

import pytest

import stream_scenarios
from helpers import unavailable, unique

pytestmark = pytest.mark.differential


@pytest.fixture(scope="module")
def rabbitmq_stream_port(rabbitmq_url) -> int:
    """The reference RabbitMQ's stream port on 127.0.0.1: $DIFFERENTIAL_RABBITMQ_STREAM_PORT, else 5552."""
    port = int(os.environ.get("DIFFERENTIAL_RABBITMQ_STREAM_PORT") or 5552)
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
    except OSError as exc:
        unavailable("RabbitMQ's stream plugin does not listen on 127.0.0.1:%d (%s)" % (port, exc))
    return port


@pytest.mark.parametrize("scenario", ["publish_confirm_consume", "offset_specs", "deduplication", "stored_offsets",
                                      "stream_errors", "raw_codes"])
async def test_same_as_rabbitmq(scenario, broker, rabbitmq_stream_port):
    run = getattr(stream_scenarios, scenario)
    name = unique("diff-stream")  # the same on both: raw_codes' metadata answers carry it
    hutch, rabbit = run(broker.ports["STREAM"], name), run(rabbitmq_stream_port, name)
    if asyncio.iscoroutine(hutch):
        hutch, rabbit = await hutch, await rabbit
    assert hutch == rabbit
