"""The AMQP 0-9-1 face: bytes <-> frames (`framing`, `fastpath` and their C
twin `_framing`), the transport (`protocol`, the only module here that
touches one), and the sans-IO session state machines (`connection`,
`channel`, `deliveries`, `declarations`, `direct_reply_to`) that drive the
domain in `vhosts`."""
