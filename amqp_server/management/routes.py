"""The management API's routes: path pattern -> {method: (handler, tag)}.

Patterns are tuples of path segments; "{name}" matches any one segment
(percent-decoded). The first matching pattern wins, so fixed segments
(`/api/users/without-permissions`) come before placeholders. The tag is
the least a user needs (`access`); vhost visibility is checked by the
handlers. Parameters of the component "vhost-limits" are reached through
/api/vhost-limits, as in RabbitMQ.
"""
from __future__ import annotations

from amqp_server.management import (accounts, clients, cluster, dead_letters, definitions, extensions, health, limits,
                                    links, mqtt_sessions, operations, overview, parameters, policies, resources, streams,
                                    topic_permissions, watermark)
from amqp_server.management.access import ADMINISTRATOR, MANAGEMENT, MONITORING, POLICYMAKER

M, MON, P, A = MANAGEMENT, MONITORING, POLICYMAKER, ADMINISTRATOR
_op = policies.operator


def _p(path: str) -> tuple[str, ...]:
    return tuple(path.strip("/").split("/"))


_TABLE = [
    ("/api/overview", {"GET": (overview.overview, M)}),
    ("/api/cluster-name", {"GET": (overview.cluster_name, M)}),
    ("/api/extensions", {"GET": (overview.extensions, M)}),
    ("/api/whoami", {"GET": (overview.whoami, M)}),
    ("/api/nodes", {"GET": (overview.nodes, MON)}),
    ("/api/nodes/{node}", {"GET": (overview.node, MON)}),
    # definitions
    ("/api/definitions", {"GET": (definitions.get_definitions, A), "POST": (definitions.post_definitions, A)}),
    ("/api/definitions/{vhost}", {"GET": (definitions.get_vhost_definitions, A),
                                  "POST": (definitions.post_vhost_definitions, A)}),
    # connections, channels, consumers
    ("/api/connections", {"GET": (clients.connections, M)}),
    ("/api/connections/{name}", {"GET": (clients.connection, M), "DELETE": (clients.close_connection, M)}),
    ("/api/connections/{name}/channels", {"GET": (clients.connection_channels, M)}),
    ("/api/channels", {"GET": (clients.channels, M)}),
    ("/api/channels/{name}", {"GET": (clients.channel, M)}),
    ("/api/consumers", {"GET": (clients.consumers, M)}),
    ("/api/consumers/{vhost}", {"GET": (clients.consumers, M)}),
    # exchanges
    ("/api/exchanges", {"GET": (resources.exchanges, M)}),
    ("/api/exchanges/{vhost}", {"GET": (resources.exchanges, M)}),
    ("/api/exchanges/{vhost}/{name}", {"GET": (resources.exchange, M), "PUT": (resources.put_exchange, M),
                                       "DELETE": (resources.delete_exchange, M)}),
    ("/api/exchanges/{vhost}/{name}/bindings/source", {"GET": (resources.exchange_source_bindings, M)}),
    ("/api/exchanges/{vhost}/{name}/bindings/destination", {"GET": (resources.exchange_destination_bindings, M)}),
    ("/api/exchanges/{vhost}/{name}/publish", {"POST": (operations.publish, M)}),
    # queues
    ("/api/queues", {"GET": (resources.queues, M)}),
    ("/api/queues/{vhost}", {"GET": (resources.queues, M)}),
    ("/api/queues/{vhost}/{name}", {"GET": (resources.queue, M), "PUT": (resources.put_queue, M),
                                    "DELETE": (resources.delete_queue, M)}),
    ("/api/queues/{vhost}/{name}/bindings", {"GET": (resources.queue_bindings, M)}),
    ("/api/queues/{vhost}/{name}/contents", {"DELETE": (operations.purge, M)}),
    ("/api/queues/{vhost}/{name}/get", {"POST": (operations.get_messages, M)}),
    # bindings
    ("/api/bindings", {"GET": (resources.bindings, M)}),
    ("/api/bindings/{vhost}", {"GET": (resources.bindings, M)}),
    ("/api/bindings/{vhost}/e/{source}/{kind}/{destination}", {"GET": (resources.bindings_between, M),
                                                               "POST": (resources.add_binding, M)}),
    ("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}", {"GET": (resources.binding, M),
                                                                       "DELETE": (resources.delete_binding, M)}),
    # vhosts
    ("/api/vhosts", {"GET": (accounts.vhosts, M)}),
    ("/api/vhosts/{vhost}", {"GET": (accounts.vhost, M), "PUT": (accounts.put_vhost, A),
                             "DELETE": (accounts.delete_vhost, A)}),
    ("/api/vhosts/{vhost}/permissions", {"GET": (accounts.vhost_permissions, A)}),
    ("/api/vhosts/{vhost}/connections", {"GET": (clients.vhost_connections, M)}),
    ("/api/vhosts/{vhost}/channels", {"GET": (clients.vhost_channels, M)}),
    # users and permissions
    ("/api/users", {"GET": (accounts.users, A)}),
    ("/api/users/without-permissions", {"GET": (accounts.users_without_permissions, A)}),
    ("/api/users/bulk-delete", {"POST": (accounts.bulk_delete_users, A)}),
    ("/api/users/{user}", {"GET": (accounts.user, A), "PUT": (accounts.put_user, A),
                           "DELETE": (accounts.delete_user, A)}),
    ("/api/users/{user}/permissions", {"GET": (accounts.user_permissions, A)}),
    ("/api/permissions", {"GET": (accounts.permissions, A)}),
    ("/api/permissions/{vhost}/{user}", {"GET": (accounts.permission, A), "PUT": (accounts.put_permission, A),
                                         "DELETE": (accounts.delete_permission, A)}),
    ("/api/users/{user}/topic-permissions", {"GET": (topic_permissions.user_topic_permissions, A)}),
    ("/api/topic-permissions", {"GET": (topic_permissions.topic_permissions, A)}),
    ("/api/topic-permissions/{vhost}/{user}", {"GET": (topic_permissions.topic_permission, A),
                                               "PUT": (topic_permissions.put_topic_permission, A),
                                               "DELETE": (topic_permissions.delete_topic_permission, A)}),
    ("/api/vhosts/{vhost}/topic-permissions", {"GET": (topic_permissions.vhost_topic_permissions, A)}),
    # policies (the policymaker rule of single policies is in the handlers)
    ("/api/policies", {"GET": (policies.policies, M)}),
    ("/api/policies/{vhost}", {"GET": (policies.policies, M)}),
    ("/api/policies/{vhost}/{name}", {"GET": (policies.policy, M), "PUT": (policies.put_policy, M),
                                      "DELETE": (policies.delete_policy, M)}),
    ("/api/operator-policies", {"GET": (_op(policies.policies), M)}),
    ("/api/operator-policies/{vhost}", {"GET": (_op(policies.policies), M)}),
    ("/api/operator-policies/{vhost}/{name}", {"GET": (_op(policies.policy), A), "PUT": (_op(policies.put_policy), A),
                                               "DELETE": (_op(policies.delete_policy), A)}),
    # runtime and global parameters (the policymaker rule of single parameters is in the handlers;
    # global parameters are a policymaker's, as in RabbitMQ)
    ("/api/parameters", {"GET": (parameters.parameters, P)}),
    ("/api/parameters/{component}", {"GET": (parameters.parameters, P)}),
    ("/api/parameters/{component}/{vhost}", {"GET": (parameters.parameters, P)}),
    ("/api/parameters/{component}/{vhost}/{name}", {"GET": (parameters.parameter, P),
                                                    "PUT": (parameters.put_parameter, P),
                                                    "DELETE": (parameters.delete_parameter, P)}),
    ("/api/global-parameters", {"GET": (parameters.global_parameters, P)}),
    ("/api/global-parameters/{name}", {"GET": (parameters.global_parameter, P),
                                       "PUT": (parameters.put_global_parameter, P),
                                       "DELETE": (parameters.delete_global_parameter, P)}),
    # shovels and federation (the plugins' management routes: reading needs the monitoring tag, as in
    # RabbitMQ; deleting or restarting a shovel is changing a parameter: the policymaker rule of
    # parameters, where RabbitMQ lets any monitoring user do it, in any vhost)
    ("/api/shovels", {"GET": (links.shovels, MON)}),
    ("/api/shovels/{vhost}", {"GET": (links.shovels, MON)}),
    ("/api/shovels/vhost/{vhost}/{name}", {"GET": (links.shovel, MON), "DELETE": (links.delete_shovel, P)}),
    ("/api/shovels/vhost/{vhost}/{name}/restart", {"DELETE": (links.restart_shovel, P)}),
    ("/api/federation-links", {"GET": (links.federation_links, MON)}),
    ("/api/federation-links/{vhost}", {"GET": (links.federation_links, MON)}),
    # limits
    ("/api/vhost-limits", {"GET": (limits.vhost_limits, M)}),
    ("/api/vhost-limits/{vhost}", {"GET": (limits.vhost_limits, M)}),
    ("/api/vhost-limits/{vhost}/{name}", {"PUT": (limits.put_vhost_limit, A),
                                          "DELETE": (limits.delete_vhost_limit, A)}),
    ("/api/user-limits", {"GET": (limits.user_limits, M)}),
    ("/api/user-limits/{user}", {"GET": (limits.user_limits, M)}),
    ("/api/user-limits/{user}/{name}", {"PUT": (limits.put_user_limit, A), "DELETE": (limits.delete_user_limit, A)}),
    # hutch's extensions
    ("/api/hutch/vm-memory-high-watermark", {"PUT": (watermark.put_watermark, A)}),
    ("/api/hutch/cluster", {"GET": (cluster.status, MON)}),
    ("/api/hutch/cluster/nodes/{node}", {"DELETE": (cluster.forget, A)}),
    ("/api/hutch/cluster/transfer-leadership", {"POST": (cluster.transfer, A)}),
    ("/api/hutch/cluster/rebalance", {"POST": (cluster.rebalance, A)}),
    ("/api/hutch/disk-free-limit", {"PUT": (watermark.put_disk_free_limit, A)}),
    ("/api/hutch/trace/{vhost}", {"PUT": (accounts.put_trace, A)}),
    ("/api/queues/{vhost}/{name}/peek", {"GET": (extensions.peek, M)}),
    ("/api/queues/{vhost}/{name}/move", {"POST": (extensions.move, M)}),
    # health
    ("/api/aliveness-test/{vhost}", {"GET": (operations.aliveness_test, M)}),
    ("/api/health/checks/alarms", {"GET": (health.alarms, M)}),
    ("/api/health/checks/local-alarms", {"GET": (health.local_alarms, M)}),
    ("/api/health/checks/virtual-hosts", {"GET": (health.ok, M)}),
    ("/api/health/checks/certificate-expiration/{within}/{unit}", {"GET": (health.ok, M)}),
    ("/api/health/checks/node-is-quorum-critical", {"GET": (health.single_node, M)}),
    ("/api/health/checks/node-is-mirror-sync-critical", {"GET": (health.single_node, M)}),
    ("/api/health/checks/port-listener/{port}", {"GET": (health.port_listener, M)}),
    ("/api/health/checks/protocol-listener/{protocol}", {"GET": (health.protocol_listener, M)}),
    ("/api/hutch/dead-letters/{vhost}", {"GET": (dead_letters.dead_letters, M)}),
    ("/api/hutch/streams/{vhost}/{name}", {"GET": (streams.stream_records, M)}),
    ("/api/hutch/mqtt/sessions", {"GET": (mqtt_sessions.sessions, M)}),
    ("/api/hutch/mqtt/sessions/{vhost}", {"GET": (mqtt_sessions.sessions, M)}),
    ("/api/hutch/mqtt/sessions/{vhost}/{client_id}", {"GET": (mqtt_sessions.session, M),
                                                      "DELETE": (mqtt_sessions.end_session, M)}),
]

ROUTES = [(_p(path), methods) for path, methods in _TABLE]
