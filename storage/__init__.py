"""Where message bodies live.

Queues in `vhosts` reach message bodies only through a `BackingQueue` (the name
RabbitMQ gives the layer under a classic queue). The in-memory implementation
keeps every message in RAM; the persistent one (queue index + shared message
store, alpha/beta/gamma/delta states) implements the same interface.
"""
from storage.backing_queue import BackingQueue, QueueEntry
from storage.memory_queue import MemoryQueue
from storage.message import Message

__all__ = ["BackingQueue", "MemoryQueue", "Message", "QueueEntry"]
