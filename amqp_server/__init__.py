"""The AMQP 0-9-1 front end: sockets, frames, connections and channels.

Only `protocol` touches a transport; everything else here is sans-IO and
drives the domain in `vhosts`.
"""
import platform

# This node's name, as RabbitMQ's "rabbit@host": in the management API and
# in trace messages.
NODE = "hutch@" + platform.node()
