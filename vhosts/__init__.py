"""The domain: virtual hosts, exchanges, queues, consumers, users.

Knows nothing of frames or sockets; `amqp_server` drives it. May import
`routing` and `storage` only.
"""
from vhosts.broker import Broker
from vhosts.consumer import Consumer
from vhosts.errors import AMQPError
from vhosts.queue import Queue
from vhosts.vhost import VirtualHost

__all__ = ["AMQPError", "Broker", "Consumer", "Queue", "VirtualHost"]
