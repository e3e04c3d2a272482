"""The composition root: opens the data directory, builds every face (AMQP,
MQTT, management, links, cluster) and gives each what it needs, opens the
listeners and runs until signalled. The only package that imports every
face; nothing in amqp_server imports it (cli.server starts it)."""
