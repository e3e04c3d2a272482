"""What the server needs to know, as plain values.

`cli.settings` builds a `BrokerConfig` from the YAML file, `HUTCH_*` environment
variables and command-line flags; nothing here reads files or the environment.
The defaults are RabbitMQ's, and `config/hutch.yaml` documents them (a test keeps
the two equal).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TLSConfig:
    """amqps listener; enabled when both certfile and keyfile are set."""

    port: int = 5671
    certfile: str | None = None
    keyfile: str | None = None
    cacertfile: str | None = None
    verify_peer: bool = False
    fail_if_no_peer_cert: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.certfile and self.keyfile)


@dataclass
class BrokerConfig:
    bind: str = "0.0.0.0"
    port: int = 5672
    data_dir: str = "./hutch-data"
    # Negotiated in Connection.Tune; the client may lower each (0 means "no limit"
    # from the client and is replaced by ours).
    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    # RabbitMQ's max_message_size default: 128 MiB.
    max_message_size: int = 134217728
    default_user: str = "guest"
    default_pass: str = "guest"
    default_vhost: str = "/"
    # Users listed here may only connect over the loopback interface.
    loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    log_level: str = "info"
    tls: TLSConfig = field(default_factory=TLSConfig)
