"""The server process and its network faces, one subpackage each:

- `amqp`: the AMQP 0-9-1 wire and sessions (framing and its C twin,
  protocol, connection, channel, deliveries, declarations, direct reply-to);
- `mqtt`: the MQTT 3.1/3.1.1 face;
- `management`: the management HTTP API, its web UI and Prometheus metrics;
- `links`: shovels and federation, AMQP clients inside the broker;
- `cluster`: replication and failover through etcd;
- `shared`: what several faces use (settings, alarms, the login throttle,
  the client-connection base, allocator habits), importing no face;
- `process`: the composition root (the server, its listeners, a cluster
  node's wiring), the only place that imports every face.

The arrows between them are checked by tests/test_layers.py and drawn in
docs/architecture.md.
"""
