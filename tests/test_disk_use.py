"""What queues leave on disk, seen in the data directory: a queue that never
stores a message creates no files at all (no directory to make on
declaration, none to remove on deletion), so a flood of short-lived
exclusive queues gives the storage writer nothing to fall behind on."""
from __future__ import annotations

import pika

from helpers import confirm_channel, unique
from storage.vhost_storage import dir_name


def queue_directories(broker) -> set[str]:
    """The queue directories of vhost "/" on every shard of the node (shard K > 0 keeps its
    queues under DATA_DIR/shards/K: docs/scaling.md)."""
    found = set()
    for data_dir in (broker.data_dir, *sorted((broker.data_dir / "shards").glob("*"))):
        queues = data_dir / "vhosts" / dir_name("/") / "queues"
        if queues.is_dir():
            found.update(path.name for path in queues.iterdir())
    return found


def test_only_queues_that_store_messages_have_a_directory(fresh_broker):
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", fresh_broker.port))
    channel = confirm_channel(connection)
    for _ in range(20):
        channel.queue_declare(unique("empty"), exclusive=True)
    channel.queue_declare(unique("durable-empty"), durable=True)
    stored = channel.queue_declare(unique("stored"), durable=True).method.queue
    channel.basic_publish("", stored, b"m", pika.BasicProperties(delivery_mode=2))
    # The confirm means the writer has done every job queued before it,
    # including whatever the declarations above asked of it.
    assert queue_directories(fresh_broker) == {dir_name(stored)}
    connection.close()
