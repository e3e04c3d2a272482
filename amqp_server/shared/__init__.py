"""What several faces of the server use, so that none imports another:
the settings as plain values (`config`), resource alarms (`alarms`), the
login throttle shared by AMQP, MQTT and HTTP (`login_throttle`), the base of
a client connection and its transport (`client`), malloc and garbage
collector habits (`allocator`), and the start-up error (`errors`). Imports
no face."""
