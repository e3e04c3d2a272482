"""The management HTTP API, its web UI and Prometheus metrics: a second
front end beside AMQP onto the same broker (docs/management.md, docs/ui.md;
the UI is static files in `static/`, served by `ui`).

`ManagementListeners` opens the HTTP listener (RabbitMQ's management API,
port 15672) and the metrics listener (/metrics, port 15692), each when
enabled, and runs the rate sampler. Handlers call the domain (`vhosts`)
directly on the event loop, as AMQP methods do.
"""
from amqp_server.management.listeners import ManagementListeners

__all__ = ["ManagementListeners"]
