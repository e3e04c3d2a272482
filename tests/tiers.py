"""The suite's tiers: what each test needs, as one marker per test (issue 40).

- memory: no broker; the test's own process (at most a short command-line
  child, such as hutchctl against nothing or a Python that imports the code).
- broker: hutch brokers as they start by default, on loopback: the session's
  shared broker (conftest.broker), or brokers the test starts, stops, kills
  and restarts itself.
- processes: nodes of explicit shard counts (tests/shard_kit.py), clusters
  with etcd (tests/cluster_kit.py), several nodes at once.
- service: something outside Python and hutch, which tests/prepare.sh
  installs or the machine has to allow: RabbitMQ (tests/differential, the
  hutchctl tests against RabbitMQ), Mosquitto, Spark (Java), Chromium, the
  Node and Java stream clients, network namespaces, cgroups. In CI such a
  test fails when its service is missing (tests/test_ci_mode.py).

`python -m pytest -m memory` is the fast tier (README), `-m "memory or broker"` the next.

conftest.pytest_collection_modifyitems marks every test with `tier(item)`:
the entry of its file in FILES, raised by TESTS (one test of a file needs
more, or less) and by what the test uses (the session broker, RabbitMQ,
Spark). A test file without an entry in FILES is a collection error: a new
file gets its line here.

It also puts each test into an xdist group (`group(item)`), so that under
pytest-xdist (`-n 2`, pyproject.toml) what must not run at the same time
does not:
- every test against the reference RabbitMQ in one group ("rabbitmq"): one
  server for the whole machine, with users, policies and definitions that
  some tests change;
- Spark's tests in one ("spark"): one JVM per worker that runs them, not one
  per worker;
- every test of the processes tier in one ("processes"): shard and cluster
  nodes miss their heartbeats (5 s) when two such tests load the two cores
  at once;
- every other test in the group of its file, so that a module's fixtures
  (a broker, a build) start once, on one worker.
"""
from __future__ import annotations

from pathlib import Path

TIERS = ("memory", "broker", "processes", "service")
TESTS_DIR = Path(__file__).resolve().parent

# The tier of a file's tests, by the file's path under tests/ (a directory
# with a trailing slash covers its files). "service:<what>" names the service;
# "service:rabbitmq" and "service:spark" tests share a group (above).
FILES = {
    "differential/": "service:rabbitmq",
    "test_ack_crash.py": "processes",
    "test_ack_hold.py": "memory",
    "test_admin.py": "broker",
    "test_alarm_rules.py": "memory",
    "test_alarms.py": "broker",
    "test_basic.py": "broker",
    "test_bench_cpu_quota.py": "service:cgroups",
    "test_bench_growth.py": "memory",
    "test_bench_table.py": "memory",
    "test_celery.py": "broker",
    "test_ci_mode.py": "broker",
    "test_clients.py": "broker",
    "test_cluster_durability.py": "processes",
    "test_cluster_election.py": "processes",
    "test_cluster_etcd.py": "processes",
    "test_cluster_etcd_errors.py": "memory",
    "test_cluster_failover.py": "processes",
    "test_cluster_lease.py": "memory",
    "test_cluster_operations.py": "processes",
    "test_cluster_partitions.py": "service:netns",
    "test_cluster_safety.py": "processes",
    "test_cluster_shards.py": "processes",
    "test_cluster_stream.py": "processes",
    "test_cluster_wire.py": "processes",
    "test_confirms_tx.py": "broker",
    "test_connection.py": "broker",
    "test_consume.py": "broker",
    "test_consumer_priorities.py": "broker",
    "test_crash.py": "broker",
    "test_credit_flow.py": "broker",
    "test_data_directory.py": "broker",
    "test_data_directory_lock.py": "processes",
    "test_dead_letter.py": "broker",
    "test_dead_letter_api.py": "broker",
    "test_dead_letter_crash.py": "broker",
    "test_dead_letter_durability.py": "memory",
    "test_dead_letter_log.py": "memory",
    "test_dead_letter_log_broker.py": "broker",
    "test_definitions.py": "memory",
    "test_delayed_exchange.py": "broker",
    "test_direct_reply_to.py": "broker",
    "test_disk_use.py": "broker",
    "test_durable_queue_model.py": "broker",
    "test_event_loop.py": "broker",
    "test_exchanges.py": "broker",
    "test_fast_start.py": "broker",
    "test_fastpath.py": "memory",
    "test_federation.py": "broker",
    "test_firehose.py": "broker",
    "test_framing.py": "memory",
    "test_fuzz_framing.py": "memory",
    "test_fuzz_live.py": "broker",
    "test_grafana_dashboard.py": "memory",
    "test_hutchctl.py": "broker",
    "test_hutchctl_cli.py": "memory",
    "test_hutchctl_dead_letters.py": "broker",
    "test_large_messages.py": "broker",
    "test_layers.py": "memory",
    "test_limits.py": "broker",
    "test_link_access.py": "broker",
    "test_link_client_isolation.py": "broker",
    "test_link_hostile_peer.py": "broker",
    "test_link_stop.py": "memory",
    "test_management_access.py": "broker",
    "test_management_api.py": "broker",
    "test_management_clients.py": "broker",
    "test_management_definitions.py": "broker",
    "test_management_history.py": "broker",
    "test_management_hostile.py": "broker",
    "test_management_message_stats.py": "broker",
    "test_management_metrics.py": "broker",
    "test_management_operations.py": "broker",
    "test_management_paging.py": "broker",
    "test_management_policies.py": "broker",
    "test_management_units.py": "memory",
    "test_memory_queue.py": "memory",
    "test_message.py": "memory",
    "test_message_headers.py": "memory",
    "test_mqtt_admin.py": "broker",
    "test_mqtt_differential.py": "service:mosquitto",
    "test_mqtt_fuzz.py": "broker",
    "test_mqtt_packets.py": "memory",
    "test_mqtt_pubsub.py": "broker",
    "test_mqtt_qos2.py": "broker",
    "test_mqtt_retained.py": "broker",
    "test_mqtt_session.py": "broker",
    "test_mqtt_tls.py": "broker",
    "test_msg_store.py": "memory",
    "test_pacing.py": "broker",
    "test_paging.py": "broker",
    "test_partition_checker.py": "memory",
    "test_peek_move.py": "broker",
    "test_permissions.py": "broker",
    "test_policies.py": "broker",
    "test_priority_queue_model.py": "memory",
    "test_priority_queues.py": "broker",
    "test_queue_index.py": "memory",
    "test_queue_policies.py": "broker",
    "test_queue_semantics_model.py": "broker",
    "test_queue_semantics_unit.py": "memory",
    "test_queues.py": "broker",
    "test_raw_protocol.py": "broker",
    "test_replica.py": "memory",
    "test_restart.py": "broker",
    "test_routing_headers.py": "memory",
    "test_routing_live.py": "broker",
    "test_routing_model.py": "memory",
    "test_routing_resolve.py": "memory",
    "test_routing_tables.py": "memory",
    "test_routing_topic.py": "memory",
    "test_security.py": "broker",
    "test_settings.py": "memory",
    "test_shard_consumers.py": "processes",
    "test_shard_count.py": "broker",
    "test_shard_faults.py": "processes",
    "test_shard_link_loss.py": "processes",
    "test_shard_links.py": "processes",
    "test_shard_records.py": "processes",
    "test_shard_soak.py": "processes",
    "test_shard_transactions.py": "processes",
    "test_shards.py": "processes",
    "test_shards_dead_letters.py": "processes",
    "test_shards_limits.py": "processes",
    "test_shards_management.py": "processes",
    "test_shovel_crash.py": "broker",
    "test_shovels.py": "broker",
    "test_shutdown.py": "broker",
    "test_slow_consumer.py": "broker",
    "test_spark_jobs.py": "service:spark",
    "test_spark_report.py": "memory",
    "test_spark_source.py": "memory",
    "test_spark_stream_reader.py": "service:spark",
    "test_spark_streaming.py": "service:spark",
    "test_spark_streams.py": "service:spark",
    "test_stream_arrow.py": "broker",
    "test_stream_bulk.py": "memory",
    "test_stream_log.py": "memory",
    "test_stream_protocol.py": "broker",
    "test_stream_protocol_edges.py": "broker",
    "test_stream_protocol_tls.py": "broker",
    "test_streambench.py": "broker",
    "test_streams.py": "broker",
    "test_tls.py": "broker",
    "test_torn_writes.py": "broker",
    "test_ttl_limits.py": "broker",
    "test_ttl_scale.py": "broker",
    "test_ui.py": "service:chromium",
    "test_ui_cluster.py": "service:chromium",
    "test_write_order.py": "memory",
}

# Tests whose tier is not their file's: "file::test function" (every
# parametrisation of it) -> tier.
TESTS = {
    "test_cluster_durability.py::test_the_in_sync_alarm_is_raised_while_the_leader_alone_is_in_sync":
        "service:chromium",
    "test_cluster_operations.py::test_a_node_that_runs_alone_reports_itself_and_refuses_cluster_operations":
        "broker",
    "test_cluster_shards.py::test_a_shard_leader_past_its_lease_hands_nothing_to_consumers_on_other_nodes":
        "service:netns",
    "test_cluster_shards.py::test_every_node_leads_a_shard_and_a_killed_nodes_shards_move_without_losing_a_confirm":
        "service:chromium",
    "test_data_directory_lock.py::test_a_start_after_a_sigkill_of_the_supervisor_waits_until_its_shards_have_ended":
        "service:cgroups",
    "test_grafana_dashboard.py::test_every_query_names_a_metric_hutch_exports": "processes",
    "test_hutchctl_cli.py::test_hutch_server_starts_with_hutchctls_environment_variables_set": "broker",
    "test_hutchctl_dead_letters.py::test_list_dead_letters_against_rabbitmq_says_it_is_a_hutch_extension":
        "service:rabbitmq",
    "test_hutchctl_dead_letters.py::test_dead_letters_runs_a_spark_job_with_hutchctls_url_vhost_and_credentials":
        "service:spark",
    "test_mqtt_admin.py::test_list_mqtt_sessions_against_rabbitmq_says_it_is_a_hutch_extension": "service:rabbitmq",
    "test_shard_count.py::test_a_cpu_quota_caps_the_default": "service:cgroups",
    "test_shard_count.py::test_a_cluster_node_is_one_shard_unless_told_more_and_then_no_connection_moves": "memory",
    "test_shards_management.py::test_the_ui_shows_the_shard_of_each_queue_and_connection": "service:chromium",
    "test_shards_management.py::test_a_shard_that_ended_shows_its_queues_down_until_it_reports_again":
        "service:chromium",
    "test_spark_streams.py::test_stream_is_only_for_export": "memory",
    "test_stream_protocol.py::test_sub_entry_batches_snappy_lz4_zstd_as_the_java_client_compresses": "service:java",
    "test_stream_protocol.py::test_javascript_stream_client": "service:node",
}

# Fixtures (conftest's, tests/differential/conftest.py's, tests/test_hutchctl.py's)
# that make a test need at least this tier, whatever its file's.
FIXTURES = {
    "broker": "broker",
    "fresh_broker": "broker",
    "start_broker": "broker",
    "sampled": "broker",
    "spark": "service:spark",
    "rabbitmq_url": "service:rabbitmq",
    "rabbitmq_api": "service:rabbitmq",
    "reference_vhost": "service:rabbitmq",
}

# Services whose tests share one xdist group (the module's docstring).
SHARED_SERVICES = ("rabbitmq", "spark")


def _rank(tier: str) -> int:
    return TIERS.index(tier.split(":")[0])


def _raise(tier: str, other: str) -> str:
    return other if _rank(other) > _rank(tier) else tier


def file_key(item) -> str:
    return Path(str(item.path)).resolve().relative_to(TESTS_DIR).as_posix()


def file_tier(key: str) -> str | None:
    if key in FILES:
        return FILES[key]
    for prefix, tier in FILES.items():
        if prefix.endswith("/") and key.startswith(prefix):
            return tier
    return None


def tier(item) -> str:
    """The item's tier, "service:<what>" for a service; KeyError when its file has no entry."""
    key = file_key(item)
    found = file_tier(key)
    if found is None:
        raise KeyError(key)
    function = getattr(item, "originalname", None) or item.name.split("[")[0]
    found = TESTS.get("%s::%s" % (key, function), found)
    for fixture in getattr(item, "fixturenames", ()):
        if fixture in FIXTURES:
            found = _raise(found, FIXTURES[fixture])
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("target") == "rabbitmq":  # tests/test_hutchctl.py
        found = _raise(found, "service:rabbitmq")
    return found


def group(item, item_tier: str) -> str:
    """The item's xdist group (the module's docstring)."""
    name, _, what = item_tier.partition(":")
    if what in SHARED_SERVICES:
        return what
    if name == "processes":
        return "processes"
    return file_key(item)


def start_rank(group_name: str, item_tier: str) -> int:
    """Where the group starts in a distributed run: the longest first
    (conftest.pytest_collection_modifyitems)."""
    if group_name == "processes":
        return 0
    if group_name in SHARED_SERVICES:
        return 1
    return 2 + len(TIERS) - 1 - _rank(item_tier)
