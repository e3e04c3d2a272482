"""The event loop setting: hutch serves on uvloop and on the standard
library's loop alike, picks uvloop by default when it is installed, and
refuses to start, with a readable error, when uvloop is asked for but
missing."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from conftest import ROOT, launch
from helpers import unavailable

try:
    import uvloop  # noqa: F401 - a dependency of hutch wherever it installs
except ImportError:
    unavailable("uvloop is not installed (a dependency of hutch on CPython outside Windows)")


def _round_trip(broker) -> bytes:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_publish("", queue, b"on this loop")
        for _method, _properties, body in channel.consume(queue, auto_ack=True, inactivity_timeout=10):
            return body
    finally:
        connection.close()


@pytest.mark.parametrize("setting, loop", [("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_each_loop_serves(start_broker, setting, loop):
    broker = start_broker("--event-loop", setting)
    assert "event loop: %s" % loop in broker.log
    assert _round_trip(broker) == b"on this loop"


@pytest.fixture
def without_uvloop(tmp_path) -> dict:
    """An environment in which `import uvloop` fails, as where it is not installed."""
    shadow = tmp_path / "shadow" / "uvloop"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("No module named \'uvloop\'")\n')
    return {"PYTHONPATH": os.pathsep.join([str(shadow.parent), str(ROOT)])}


def test_auto_falls_back_to_asyncio_without_uvloop(tmp_path, without_uvloop):
    broker = launch(tmp_path, env=without_uvloop)
    try:
        assert "event loop: asyncio" in broker.log
        assert _round_trip(broker) == b"on this loop"
    finally:
        broker.stop()


def test_uvloop_asked_for_but_missing_is_a_readable_error(tmp_path, without_uvloop):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    env.update(without_uvloop)
    result = subprocess.run(
        [sys.executable, "-m", "cli.server", "--port", "0", "--data-dir", str(Path(tmp_path) / "data"),
         "--event-loop", "uvloop"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        "hutch-server: event_loop is uvloop, but uvloop is not installed (pip install uvloop)")
    assert "Traceback" not in result.stderr
