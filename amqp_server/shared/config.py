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
class StorageConfig:
    """Durable storage (docs/storage.md); RabbitMQ's names in brackets."""

    # What a publisher confirm of a persistent message waits for: "fsync"
    # (written and synced) or "flush" (handed to the OS, RabbitMQ 3.13+).
    durability: str = "fsync"
    # Roll a message store file at this size. [msg_store_file_size_limit]
    msg_store_file_size: int = 16777216
    # Messages smaller than this live in the queue index itself.
    # [queue_index_embed_msgs_below]
    embed_below: int = 4096
    # Sequence numbers per queue index segment file.
    segment_entries: int = 4096
    # Memory budget for messages: this fraction of RAM, unless
    # vm_memory_high_watermark_absolute (bytes) is set. [vm_memory_high_watermark]
    vm_memory_high_watermark: float = 0.4
    vm_memory_high_watermark_absolute: int | None = None
    # Queues start paging messages out at this fraction of the watermark.
    # [vm_memory_high_watermark_paging_ratio]
    paging_ratio: float = 0.5
    # Publishers are blocked while the data directory's filesystem has less
    # free space than this many bytes [disk_free_limit.absolute], or than this
    # fraction of RAM when disk_free_limit_mem_relative is set
    # [disk_free_limit.relative].
    disk_free_limit: int = 50000000
    disk_free_limit_mem_relative: float | None = None


@dataclass
class ManagementConfig:
    """The management HTTP API (RabbitMQ's rabbitmq_management plugin)."""

    enabled: bool = True
    bind: str = "0.0.0.0"
    port: int = 15672
    # Seconds between the samples message rates are computed from.
    # [collect_statistics_interval, in ms there]
    sample_interval: float = 5.0
    # Largest request body in bytes (RabbitMQ's management.http.max_body_size).
    max_body_size: int = 10000000
    # Seconds a connection (API or metrics) may take to send a request head
    # (from its opening or the previous answer), and the longest pause inside a
    # body (cowboy's request_timeout, 5 s, in RabbitMQ).
    request_timeout: float = 5.0


@dataclass
class PrometheusConfig:
    """Prometheus metrics at /metrics (RabbitMQ's rabbitmq_prometheus plugin)."""

    enabled: bool = True
    bind: str = "0.0.0.0"
    port: int = 15692


@dataclass
class DeadLetterLogConfig:
    """The per-vhost log of every message that dies, read by offset over the
    management API (docs/analytics.md)."""

    enabled: bool = True
    # Keep message bodies in the log (off: only their size).
    include_bodies: bool = True
    # Delete the oldest whole segments beyond this many bytes per vhost; 0 = no limit.
    retention_bytes: int = 268435456
    # Delete segments whose newest record is older than this; 0 = no limit.
    retention_seconds: int = 604800
    # Roll to a new segment file at this size.
    segment_bytes: int = 16777216


@dataclass
class MQTTConfig:
    """The MQTT 3.1/3.1.1 listener (RabbitMQ's rabbitmq_mqtt plugin, docs/mqtt.md)."""

    enabled: bool = True
    port: int = 1883
    # MQTT over TLS, with the certificate and key of `tls`, when those are set.
    tls_port: int = 8883
    # The vhost of a username without "vhost:" in front. [mqtt.vhost]
    vhost: str = "/"
    exchange: str = "amq.topic"
    # A CONNECT without a username logs in as this user. [mqtt.allow_anonymous]
    allow_anonymous: bool = True
    default_user: str = "guest"
    default_pass: str = "guest"
    # Unacknowledged QoS 1 deliveries per subscription. [mqtt.prefetch]
    prefetch: int = 10


@dataclass
class StreamConfig:
    """The RabbitMQ stream protocol listener (RabbitMQ's rabbitmq_stream plugin,
    docs/streams.md), onto the same stream queues as AMQP 0-9-1."""

    enabled: bool = True
    port: int = 5552  # [stream.listeners.tcp]
    # The stream protocol over TLS, with the certificate and key of `tls`, when
    # those are set. [stream.listeners.ssl]
    tls_port: int = 5551
    # Host and port metadata tells clients to connect to (RabbitMQ's
    # advertised_host/advertised_port); None: the cluster's advertised host or
    # else the address the client reached, and this node's stream port.
    advertised_host: str | None = None
    advertised_port: int | None = None
    # Largest frame accepted and proposed in Tune; heartbeat seconds proposed. [stream.frame_max, stream.heartbeat]
    frame_max: int = 1048576
    heartbeat: int = 60


@dataclass
class ClusterConfig:
    """Replication and automatic failover (docs/cluster.md): off, and the node
    runs alone, while `etcd` is empty."""

    # etcd client URLs (http://host:port, or https://host:port for TLS), any
    # of which may be asked.
    etcd: list[str] = field(default_factory=list)
    # TLS to etcd (https URLs): the CA certificate (PEM) that signed etcd's
    # certificate (None: the system's), and a client certificate and key when
    # etcd asks for one (--client-cert-auth).
    etcd_cacert: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    # etcd user authentication (etcd's `auth enable`): user and password.
    etcd_user: str | None = None
    etcd_password: str | None = None
    # This node's name in the cluster, unique in it; None: the host name.
    node_name: str | None = None
    # Port followers connect to for the replication stream.
    replication_port: int = 5679
    # Host or address the other nodes dial to reach this one (replication,
    # forwarded client connections); None: the host name.
    advertise: str | None = None
    # Prefix of hutch's keys in etcd (several clusters may share one etcd).
    etcd_prefix: str = "hutch"
    # Seconds of the leader's etcd lease: a dead or cut-off leader is replaced
    # after about this long, and stops answering before that.
    lease_ttl: int = 5
    # Durability-promising replies wait for every in-sync follower; with N
    # set, for N of them instead (the most complete in-sync node is elected,
    # docs/cluster.md), and are withheld while fewer than N are in sync.
    min_in_sync_replicas: int | None = None
    # A follower further behind than this many bytes, or with a reply waiting
    # for its acknowledgement longer than max_lag_seconds, leaves the in-sync set.
    max_lag_bytes: int = 67108864
    max_lag_seconds: float = 5.0
    # The cluster's shared secret, the same on every node (required with
    # etcd): replication connections prove they hold it, both ways.
    secret: str | None = None
    # Address the replication listener binds; None: the advertised one.
    replication_bind: str | None = None
    # Seconds of silence after which either end closes a replication
    # connection (heartbeats go every quarter of it).
    replication_timeout: float = 10.0
    # TLS for the replication stream (mutual: each node presents its
    # certificate, signed by the cluster's CA, and verifies the other's).
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    tls_cacertfile: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.etcd)


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
    # Open AMQP connections on this node; None = no limit. [connection_max]
    connection_max: int | None = None
    # Consumers on one channel; None = no limit. [consumer_max_per_channel, RabbitMQ 3.12+]
    consumer_max_per_channel: int | None = None
    # Seconds a refused login (AMQP or management API) is delayed, doubling per
    # consecutive failure of the same user from the same address over either,
    # capped by auth_failure_delay_max (beyond RabbitMQ).
    auth_failure_delay: float = 0.1
    auth_failure_delay_max: float = 5.0
    # Seconds a closing connection waits for the client: for its Close-Ok to
    # our Connection.Close, or to close the socket after our Close-Ok; the
    # negotiated heartbeat when that is shorter. [RabbitMQ's fixed ?CLOSING_TIMEOUT]
    closing_timeout: float = 30.0
    # channel.flow(active=false) pauses the channel's deliveries as the AMQP
    # spec says; off: refused with 540 NOT_IMPLEMENTED as RabbitMQ does.
    channel_flow_pause: bool = False
    default_user: str = "guest"
    default_pass: str = "guest"
    default_vhost: str = "/"
    # Users listed here may only connect over the loopback interface.
    loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    log_level: str = "info"
    # The asyncio event loop: "auto" (uvloop when it is installed, else the
    # standard library's), "uvloop" or "asyncio" (beyond RabbitMQ).
    event_loop: str = "auto"
    # Shard processes of this node (docs/scaling.md): each owns its queues on
    # its own event loop; 1 is one process (beyond RabbitMQ, whose schedulers
    # are its threads). 0: as many as the cores the process may use, one in a
    # cluster (cli.settings resolves it at start).
    shards: int = 0
    # On a node of several shards, a connection whose traffic is all for another
    # shard's queues moves there (docs/scaling.md); false: it is served where it landed.
    shard_moves: bool = True
    # Seconds a shard's link to another shard of this node may stay silent (every link
    # carries a heartbeat every quarter of it) before that shard is taken for stalled:
    # it is killed and the supervisor starts it again (docs/scaling.md, "When a shard
    # ends"). In a cluster, cluster.replication_timeout plays this part.
    shard_timeout: float = 5.0
    tls: TLSConfig = field(default_factory=TLSConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    management: ManagementConfig = field(default_factory=ManagementConfig)
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)
    dead_letter_log: DeadLetterLogConfig = field(default_factory=DeadLetterLogConfig)
    mqtt: MQTTConfig = field(default_factory=MQTTConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
