"""The RabbitMQ stream protocol (port 5552) onto hutch's stream queues:
`frames` (the sans-IO codec), `chunks` (deliveries as osiris chunks),
`connection` (one client's state machine and commands), `protocol` (the
asyncio transport side), `tracking` (server-side offsets and publisher
sequences), `groups` (single active consumer), `super_streams`.
docs/streams.md describes the protocol as hutch serves it."""
