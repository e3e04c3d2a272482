"""The data directory on a first start and on a failed one: a new directory
is reported as new (not as a crash to recover from), and a start that fails
removes the directory it created, leaving one that existed alone."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pika

from conftest import ROOT, launch

NEW = "created a new data directory"
SCAN = "no clean-shutdown marker"


def test_a_first_start_says_it_created_a_new_data_directory(tmp_path):
    broker = launch(tmp_path)
    try:
        assert NEW in broker.log and SCAN not in broker.log
        assert (broker.data_dir / "definitions.db").exists()
    finally:
        broker.process.kill()
        broker.process.wait()
    again = launch(tmp_path, "--data-dir", str(broker.data_dir))  # after a kill -9: recovery
    try:
        assert SCAN in again.log and NEW not in again.log
    finally:
        again.stop()


def test_an_empty_existing_data_directory_is_new_too(tmp_path):
    empty = tmp_path / "mounted"
    empty.mkdir()
    broker = launch(tmp_path, "--data-dir", str(empty))
    try:
        assert "data directory %s is empty: starting a new one there" % empty in broker.log
        assert SCAN not in broker.log
    finally:
        broker.stop()


def start_on_a_busy_port(cwd, *args: str) -> subprocess.CompletedProcess:
    """hutch-server run from `cwd` with its AMQP port taken: it must exit 1.
    With as many shards as the brokers conftest.launch starts (TEST_SHARDS),
    so it is started as the node that used the data directory was."""
    shards = os.environ.get("TEST_SHARDS", "1")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), environ.get("PYTHONPATH", "")])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = subprocess.run(
            [sys.executable, "-m", "cli.server", "--bind", "127.0.0.1", "--port", str(busy.getsockname()[1]),
             "--management-enabled", "false", "--prometheus-enabled", "false", "--mqtt-enabled", "false",
             "--stream-enabled", "false", "--shards", shards, *args],
            cwd=cwd, env=environ, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "cannot listen for AMQP" in result.stderr and "Traceback" not in result.stderr
    return result


def test_a_failed_start_leaves_no_default_data_directory_behind(tmp_path):
    start_on_a_busy_port(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no ./hutch-data


def test_a_failed_start_removes_the_directories_it_created_and_only_those(tmp_path):
    start_on_a_busy_port(tmp_path, "--data-dir", str(tmp_path / "a" / "b" / "data"))
    assert list(tmp_path.iterdir()) == []  # the missing parents went too
    (tmp_path / "empty").mkdir()
    start_on_a_busy_port(tmp_path, "--data-dir", str(tmp_path / "empty"))
    assert (tmp_path / "empty").is_dir() and list((tmp_path / "empty").iterdir()) == []  # as it was


def test_a_failed_start_keeps_an_existing_data_directory_and_what_it_holds(tmp_path):
    broker = launch(tmp_path)
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("kept", durable=True)
        channel.basic_publish("", "kept", b"m", pika.BasicProperties(delivery_mode=2))
    broker.stop()
    start_on_a_busy_port(tmp_path, "--data-dir", str(broker.data_dir))
    again = launch(tmp_path, "--data-dir", str(broker.data_dir))
    try:
        with pika.BlockingConnection(pika.URLParameters(again.url)) as connection:
            assert connection.channel().queue_declare("kept", passive=True).method.message_count == 1
    finally:
        again.stop()


def test_a_stop_during_the_first_start_keeps_the_data_directory(tmp_path):
    # launch returns once AMQP listens; the rest of the start (MQTT, the stream port, HTTP) may
    # still be under way when the stop arrives: a stop is not a failed start, and AMQP may
    # already have served a client, so nothing the start made is removed. One process: a
    # node of several shards has its supervisor hold the directory, which a stop never removes
    broker = launch(tmp_path, "--default-pass", "first", "--shards", "1")
    broker.stop()
    assert (broker.data_dir / "definitions.db").exists()
    again = launch(tmp_path, "--data-dir", str(broker.data_dir), "--default-pass", "changed", "--shards", "1")
    try:
        assert NEW not in again.log  # the directory was still there
        credentials = pika.PlainCredentials("guest", "first")  # seeded by the first start
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", again.port,
                                                               credentials=credentials)) as connection:
            assert connection.is_open
    finally:
        again.stop()
