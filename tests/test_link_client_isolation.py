"""The links' AMQP client (amqp_server.links.connection) is aiormq
subclassed, not aiormq patched: importing the broker leaves aiormq's,
aio-pika's and pamqp's modules exactly as they were, so a real client in a
process that imports the server (a test, a tool) is still the real client.

In a fresh interpreter (this process may have imported the server already),
the script records every attribute of every aiormq, aio_pika and pamqp
module and of the classes they define, imports every module of the
amqp_server package, opens a link connection, and checks each attribute is
still the same object; then plain aiormq and aio-pika clients publish,
confirm and consume through the session broker."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import asyncio, importlib, inspect, pkgutil, sys

import aio_pika, aiormq, aiormq.channel, aiormq.connection, pamqp.frame

LIBRARIES = ("aiormq", "aio_pika", "pamqp")


def attributes():
    found = {}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in LIBRARIES or module is None:
            continue
        for attribute, value in list(vars(module).items()):
            found[(name, attribute)] = value
            if inspect.isclass(value) and value.__module__ == name:
                for key, member in list(vars(value).items()):
                    found[(name, attribute, key)] = member
    return found


before = attributes()
import amqp_server
for info in pkgutil.walk_packages(amqp_server.__path__, "amqp_server."):
    importlib.import_module(info.name)
from amqp_server.links.connection import connect as link_connect


async def main(url):
    link = await link_connect(url, "isolation check")  # a link connection at work, too
    await (await link.channel()).queue_declare("", exclusive=True)
    await link.close()

    after = attributes()
    changed = sorted(".".join(key) for key, value in before.items() if after.get(key, changed_marker) is not value)
    assert not changed, "changed by importing the broker: %s" % changed[:20]
    assert aiormq.connection.FrameReceiver.__module__ == "aiormq.connection"

    connection = await aiormq.connect(url)
    channel = await connection.channel()
    declared = await channel.queue_declare("", exclusive=True)
    await channel.basic_publish(b"plain aiormq", routing_key=declared.queue)
    got = await channel.basic_get(declared.queue, no_ack=True)
    assert got.body == b"plain aiormq", got
    assert type(connection) is aiormq.Connection and type(channel) is aiormq.Channel
    await connection.close()

    robust = await aio_pika.connect_robust(url)
    async with robust:
        channel = await robust.channel(publisher_confirms=True)
        queue = await channel.declare_queue(exclusive=True)
        for i in range(50):
            await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue.name)
        bodies = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    bodies.append(message.body)
                if len(bodies) == 50:
                    break
        assert bodies == [b"%d" % i for i in range(50)], bodies
    print("UNTOUCHED")


changed_marker = object()
asyncio.run(main(sys.argv[1]))
'''


def test_importing_the_broker_leaves_aiormq_and_aio_pika_untouched(broker):
    result = subprocess.run([sys.executable, "-c", SCRIPT, broker.url], cwd=ROOT, capture_output=True,
                            text=True, timeout=90)
    assert result.returncode == 0 and result.stdout.strip() == "UNTOUCHED", result.stdout + result.stderr
