"""The rows of the management API's authorisation matrix
(test_diff_authorisation.py): for every route and method of
amqp_server/management/routes.py, the request that exercises it.

A `Row` names a concrete path (`{key}` fields come from `World`: one vhost
`V` where half of the test users have permissions, and the objects in it),
a body, and what to restore after a request that succeeded (a delete or a
connection close), so that every user meets the same state. `hutch` rows are
hutch's own routes, absent from RabbitMQ: they say which tag they require
(and whether a permission in the vhost is needed too) and the test checks
hutch against that rule. `deviation` says why hutch answers otherwise than
RabbitMQ on purpose (docs/security.md lists each), with the statuses hutch
gives instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pika

from helpers import unique, wait_for
from http_api import segment

TAGS = ("none", "management", "policymaker", "monitoring", "administrator")
# the users of the matrix: each tag, with and without permissions in the vhost
USERS = [(tag, with_permissions) for tag in TAGS for with_permissions in (True, False)]
EVERYTHING = {"configure": ".*", "write": ".*", "read": ".*"}


@dataclass
class Row:
    path: str
    body: object = None
    restore: str | None = None  # a World method run after a 2xx answer
    # hutch's own route: (tag required, scope): scope None, "vhost" (a permission in it or the
    # administrator tag) or "messages" (a permission in it: the messages are read as basic.get would)
    hutch: tuple | None = None
    deviation: tuple | None = None  # (why, {(tag, with_permissions): hutch's status}) where hutch differs
    extra: dict = field(default_factory=dict)


class World:
    """The objects the rows use, on one broker, made with its administrator's
    Api; the same names on both brokers."""

    def __init__(self, api, run: str, node: str, amqp_url: str) -> None:
        self.api = api
        self.amqp_url = amqp_url
        self.names = {
            "V": "authz-%s" % run, "D": "authz-%s-doomed" % run, "q": "q", "dq": "dq", "x": "x", "dx": "dx",
            "target": "authz-%s-target" % run, "victim": "authz-%s-victim" % run, "nobody": "authz-%s-nobody" % run,
            "p": "p", "dp": "dp", "up": "up", "dup": "dup", "gp": "authz-%s-gp" % run, "dgp": "authz-%s-dgp" % run,
            "node": node, "amqp_port": str(pika.URLParameters(amqp_url).port),
        }
        self.users = {key: "authz-%s-%s-%s" % (run, key[0], "with" if key[1] else "without") for key in USERS}
        self.amqp = None

    def field(self, key: str) -> str:
        if key in ("conn", "chan"):
            return segment(self.connection_name + (" (1)" if key == "chan" else ""))
        return segment(self.names[key])

    def ok(self, reply, *statuses: int):
        assert reply.status in (statuses or (200, 201, 204)), reply
        return reply

    # made once

    def build(self) -> None:
        n, api = self.names, self.api
        for vhost in (n["V"], n["D"]):
            self.ok(api.put("/api/vhosts/" + segment(vhost)))
            self.ok(api.put("/api/permissions/%s/%s" % (segment(vhost), segment(api.auth[0])), EVERYTHING))
        for user in (n["target"], n["victim"]):
            self.ok(api.put("/api/users/" + segment(user), {"password": "pw", "tags": ""}))
        for (tag, with_permissions), user in self.users.items():
            self.ok(api.put("/api/users/" + segment(user), {"password": "pw", "tags": "" if tag == "none" else tag}))
            if with_permissions:
                for vhost in (n["V"], n["D"]):
                    self.ok(api.put("/api/permissions/%s/%s" % (segment(vhost), segment(user)), EVERYTHING))
        V = segment(n["V"])
        self.ok(api.put("/api/permissions/%s/%s" % (V, segment(n["target"])), EVERYTHING))
        self.ok(api.put("/api/topic-permissions/%s/%s" % (V, segment(n["target"])),
                        {"exchange": "amq.topic", "write": ".*", "read": ".*"}))
        self.ok(api.put("/api/queues/%s/q" % V, {"durable": True}))
        self.ok(api.put("/api/exchanges/%s/x" % V, {"type": "direct"}))
        self.ok(api.post("/api/bindings/%s/e/x/q/q" % V, {"routing_key": "k"}))
        self.ok(api.put("/api/policies/%s/p" % V, POLICY))
        self.ok(api.put("/api/operator-policies/%s/p" % V, OPERATOR_POLICY))
        self.ok(api.put("/api/parameters/federation-upstream/%s/up" % V, UPSTREAM))
        self.ok(api.put("/api/global-parameters/" + segment(n["gp"]), {"value": "v"}))
        self.ok(api.put("/api/vhost-limits/%s/max-connections" % V, {"value": 1000}))
        self.ok(api.put("/api/user-limits/%s/max-connections" % segment(n["target"]), {"value": 1000}))
        for restore in ("vhost_d", "user_victim", "permission_target", "topic_permission_target", "queue_dq",
                        "exchange_dx", "binding_dk", "policy_dp", "operator_policy_dp", "upstream_dup",
                        "global_parameter_dgp", "vhost_limit", "user_limit", "reconnect"):
            getattr(self, restore)()

    def destroy(self) -> None:
        if self.amqp is not None and self.amqp.is_open:
            self.amqp.close()
        n = self.names
        for vhost in (n["V"], n["D"]):
            self.api.delete("/api/vhosts/" + segment(vhost))
        for user in [n["target"], n["victim"], *self.users.values()]:
            self.api.delete("/api/users/" + segment(user))
        for gp in (n["gp"], n["dgp"]):
            self.api.delete("/api/global-parameters/" + segment(gp))

    # restored after a row that deleted them

    def vhost_d(self) -> None:
        D = segment(self.names["D"])
        self.ok(self.api.put("/api/vhosts/" + D))
        self.ok(self.api.put("/api/permissions/%s/%s" % (D, segment(self.api.auth[0])), EVERYTHING))
        for (_tag, with_permissions), user in self.users.items():
            if with_permissions:
                self.ok(self.api.put("/api/permissions/%s/%s" % (D, segment(user)), EVERYTHING))

    def user_victim(self) -> None:
        self.ok(self.api.put("/api/users/" + segment(self.names["victim"]), {"password": "pw", "tags": ""}))

    def permission_target(self) -> None:
        self.ok(self.api.put("/api/permissions/%s/%s" % (self.field("V"), self.field("target")), EVERYTHING))

    def topic_permission_target(self) -> None:
        self.ok(self.api.put("/api/topic-permissions/%s/%s" % (self.field("V"), self.field("target")),
                             {"exchange": "amq.topic", "write": ".*", "read": ".*"}))

    def queue_dq(self) -> None:
        self.ok(self.api.put("/api/queues/%s/dq" % self.field("V"), {"durable": True}))

    def exchange_dx(self) -> None:
        self.ok(self.api.put("/api/exchanges/%s/dx" % self.field("V"), {"type": "direct"}))

    def binding_dk(self) -> None:
        self.ok(self.api.post("/api/bindings/%s/e/x/q/q" % self.field("V"), {"routing_key": "dk"}))

    def policy_dp(self) -> None:
        self.ok(self.api.put("/api/policies/%s/dp" % self.field("V"), POLICY))

    def operator_policy_dp(self) -> None:
        self.ok(self.api.put("/api/operator-policies/%s/dp" % self.field("V"), OPERATOR_POLICY))

    def upstream_dup(self) -> None:
        self.ok(self.api.put("/api/parameters/federation-upstream/%s/dup" % self.field("V"), UPSTREAM))

    def global_parameter_dgp(self) -> None:
        self.ok(self.api.put("/api/global-parameters/" + self.field("dgp"), {"value": "v"}))

    def vhost_limit(self) -> None:
        self.ok(self.api.put("/api/vhost-limits/%s/max-queues" % self.field("V"), {"value": 1000}))

    def user_limit(self) -> None:
        self.ok(self.api.put("/api/user-limits/%s/max-channels" % self.field("target"), {"value": 1000}))

    def reconnect(self) -> None:
        """An administrator's AMQP connection with one channel, listed by the API."""
        label = unique("authz-conn")
        params = pika.URLParameters(self.amqp_url)
        params.heartbeat = 0
        params.client_properties = {"connection_name": label}
        self.amqp = pika.BlockingConnection(params)
        self.amqp.channel()

        def listed():
            for conn in self.api.get("/api/connections").body:
                if (conn.get("client_properties") or {}).get("connection_name") == label:
                    return conn["name"]
            return None

        self.connection_name = wait_for(listed, timeout=30, what="the connection in /api/connections")
        wait_for(lambda: self.api.get("/api/channels/" + self.field("chan")).status == 200, timeout=30,
                 what="its channel in /api/channels")


POLICY = {"pattern": "^authz-matches-nothing$", "definition": {"max-length": 100}, "apply-to": "queues"}
OPERATOR_POLICY = {"pattern": "^authz-matches-nothing$", "definition": {"max-length": 100}, "apply-to": "queues"}
UPSTREAM = {"value": {"uri": "amqp://127.0.0.1:1"}}
PUBLISH = {"properties": {}, "routing_key": "nowhere", "payload": "p", "payload_encoding": "string"}
GET = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}

M, MON, P, A = "management", "monitoring", "policymaker", "administrator"
SHOVEL_CHANGE = (
    "RabbitMQ 3.10 lets any monitoring user delete or restart a shovel, in any vhost, and refuses a "
    "policymaker who may delete the same shovel's parameter; hutch applies the parameters' rule: an "
    "administrator, or a policymaker with a permission in the vhost (404: there is no such shovel)",
    {("policymaker", True): 404, ("monitoring", True): 401, ("monitoring", False): 401})

ROWS: dict[tuple[str, str], Row] = {
    ("/api/overview", "GET"): Row("/api/overview"),
    ("/api/cluster-name", "GET"): Row("/api/cluster-name"),
    ("/api/extensions", "GET"): Row("/api/extensions"),
    ("/api/whoami", "GET"): Row("/api/whoami"),
    ("/api/nodes", "GET"): Row("/api/nodes"),
    ("/api/nodes/{node}", "GET"): Row("/api/nodes/{node}"),
    ("/api/definitions", "GET"): Row("/api/definitions"),
    ("/api/definitions", "POST"): Row("/api/definitions", {}),
    ("/api/definitions/{vhost}", "GET"): Row("/api/definitions/{V}"),
    ("/api/definitions/{vhost}", "POST"): Row("/api/definitions/{V}", {}),
    ("/api/connections", "GET"): Row("/api/connections"),
    ("/api/connections/{name}", "GET"): Row("/api/connections/{conn}"),
    ("/api/connections/{name}", "DELETE"): Row("/api/connections/{conn}", restore="reconnect"),
    ("/api/connections/{name}/channels", "GET"): Row("/api/connections/{conn}/channels"),
    ("/api/channels", "GET"): Row("/api/channels"),
    ("/api/channels/{name}", "GET"): Row("/api/channels/{chan}"),
    ("/api/consumers", "GET"): Row("/api/consumers"),
    ("/api/consumers/{vhost}", "GET"): Row("/api/consumers/{V}"),
    ("/api/exchanges", "GET"): Row("/api/exchanges"),
    ("/api/exchanges/{vhost}", "GET"): Row("/api/exchanges/{V}"),
    ("/api/exchanges/{vhost}/{name}", "GET"): Row("/api/exchanges/{V}/{x}"),
    ("/api/exchanges/{vhost}/{name}", "PUT"): Row("/api/exchanges/{V}/{x}", {"type": "direct"}),
    ("/api/exchanges/{vhost}/{name}", "DELETE"): Row("/api/exchanges/{V}/{dx}", restore="exchange_dx"),
    ("/api/exchanges/{vhost}/{name}/bindings/source", "GET"): Row("/api/exchanges/{V}/{x}/bindings/source"),
    ("/api/exchanges/{vhost}/{name}/bindings/destination", "GET"): Row("/api/exchanges/{V}/{x}/bindings/destination"),
    ("/api/exchanges/{vhost}/{name}/publish", "POST"): Row("/api/exchanges/{V}/{x}/publish", PUBLISH),
    ("/api/queues", "GET"): Row("/api/queues"),
    ("/api/queues/{vhost}", "GET"): Row("/api/queues/{V}"),
    ("/api/queues/{vhost}/{name}", "GET"): Row("/api/queues/{V}/{q}"),
    ("/api/queues/{vhost}/{name}", "PUT"): Row("/api/queues/{V}/{q}", {"durable": True}),
    ("/api/queues/{vhost}/{name}", "DELETE"): Row("/api/queues/{V}/{dq}", restore="queue_dq"),
    ("/api/queues/{vhost}/{name}/bindings", "GET"): Row("/api/queues/{V}/{q}/bindings"),
    ("/api/queues/{vhost}/{name}/contents", "DELETE"): Row("/api/queues/{V}/{q}/contents"),
    ("/api/queues/{vhost}/{name}/get", "POST"): Row("/api/queues/{V}/{q}/get", GET),
    ("/api/bindings", "GET"): Row("/api/bindings"),
    ("/api/bindings/{vhost}", "GET"): Row("/api/bindings/{V}"),
    ("/api/bindings/{vhost}/e/{source}/{kind}/{destination}", "GET"): Row("/api/bindings/{V}/e/{x}/q/{q}"),
    ("/api/bindings/{vhost}/e/{source}/{kind}/{destination}", "POST"): Row("/api/bindings/{V}/e/{x}/q/{q}",
                                                                           {"routing_key": "k"}),
    ("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}", "GET"): Row("/api/bindings/{V}/e/{x}/q/{q}/k"),
    ("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}", "DELETE"): Row(
        "/api/bindings/{V}/e/{x}/q/{q}/dk", restore="binding_dk"),
    ("/api/vhosts", "GET"): Row("/api/vhosts"),
    ("/api/vhosts/{vhost}", "GET"): Row("/api/vhosts/{V}", deviation=(
        "RabbitMQ 3.10 shows one vhost to administrators only, though /api/vhosts lists the same object to "
        "any management user with a permission in it; hutch's UI reads it for the vhost selected",
        {("management", True): 200, ("policymaker", True): 200, ("monitoring", True): 200})),
    ("/api/vhosts/{vhost}", "PUT"): Row("/api/vhosts/{V}", {}),
    ("/api/vhosts/{vhost}", "DELETE"): Row("/api/vhosts/{D}", restore="vhost_d"),
    ("/api/vhosts/{vhost}/permissions", "GET"): Row("/api/vhosts/{V}/permissions"),
    ("/api/vhosts/{vhost}/connections", "GET"): Row("/api/vhosts/{V}/connections"),
    ("/api/vhosts/{vhost}/channels", "GET"): Row("/api/vhosts/{V}/channels"),
    ("/api/users", "GET"): Row("/api/users"),
    ("/api/users/without-permissions", "GET"): Row("/api/users/without-permissions"),
    ("/api/users/bulk-delete", "POST"): Row("/api/users/bulk-delete", {"users": ["{nobody}"]}),
    ("/api/users/{user}", "GET"): Row("/api/users/{target}"),
    ("/api/users/{user}", "PUT"): Row("/api/users/{target}", {"password": "pw", "tags": ""}),
    ("/api/users/{user}", "DELETE"): Row("/api/users/{victim}", restore="user_victim"),
    ("/api/users/{user}/permissions", "GET"): Row("/api/users/{target}/permissions"),
    ("/api/permissions", "GET"): Row("/api/permissions"),
    ("/api/permissions/{vhost}/{user}", "GET"): Row("/api/permissions/{V}/{target}"),
    ("/api/permissions/{vhost}/{user}", "PUT"): Row("/api/permissions/{V}/{target}", EVERYTHING),
    ("/api/permissions/{vhost}/{user}", "DELETE"): Row("/api/permissions/{V}/{target}", restore="permission_target"),
    ("/api/users/{user}/topic-permissions", "GET"): Row("/api/users/{target}/topic-permissions"),
    ("/api/topic-permissions", "GET"): Row("/api/topic-permissions"),
    ("/api/topic-permissions/{vhost}/{user}", "GET"): Row("/api/topic-permissions/{V}/{target}"),
    ("/api/topic-permissions/{vhost}/{user}", "PUT"): Row("/api/topic-permissions/{V}/{target}",
                                                          {"exchange": "amq.topic", "write": ".*", "read": ".*"}),
    ("/api/topic-permissions/{vhost}/{user}", "DELETE"): Row("/api/topic-permissions/{V}/{target}",
                                                             restore="topic_permission_target"),
    ("/api/vhosts/{vhost}/topic-permissions", "GET"): Row("/api/vhosts/{V}/topic-permissions"),
    ("/api/policies", "GET"): Row("/api/policies"),
    ("/api/policies/{vhost}", "GET"): Row("/api/policies/{V}"),
    ("/api/policies/{vhost}/{name}", "GET"): Row("/api/policies/{V}/{p}"),
    ("/api/policies/{vhost}/{name}", "PUT"): Row("/api/policies/{V}/{p}", POLICY),
    ("/api/policies/{vhost}/{name}", "DELETE"): Row("/api/policies/{V}/{dp}", restore="policy_dp"),
    ("/api/operator-policies", "GET"): Row("/api/operator-policies"),
    ("/api/operator-policies/{vhost}", "GET"): Row("/api/operator-policies/{V}"),
    ("/api/operator-policies/{vhost}/{name}", "GET"): Row("/api/operator-policies/{V}/{p}"),
    ("/api/operator-policies/{vhost}/{name}", "PUT"): Row("/api/operator-policies/{V}/{p}", OPERATOR_POLICY),
    ("/api/operator-policies/{vhost}/{name}", "DELETE"): Row("/api/operator-policies/{V}/{dp}",
                                                             restore="operator_policy_dp"),
    ("/api/parameters", "GET"): Row("/api/parameters"),
    ("/api/parameters/{component}", "GET"): Row("/api/parameters/federation-upstream"),
    ("/api/parameters/{component}/{vhost}", "GET"): Row("/api/parameters/federation-upstream/{V}"),
    ("/api/parameters/{component}/{vhost}/{name}", "GET"): Row("/api/parameters/federation-upstream/{V}/{up}"),
    ("/api/parameters/{component}/{vhost}/{name}", "PUT"): Row("/api/parameters/federation-upstream/{V}/{up}",
                                                               UPSTREAM),
    ("/api/parameters/{component}/{vhost}/{name}", "DELETE"): Row("/api/parameters/federation-upstream/{V}/{dup}",
                                                                  restore="upstream_dup"),
    ("/api/global-parameters", "GET"): Row("/api/global-parameters"),
    ("/api/global-parameters/{name}", "GET"): Row("/api/global-parameters/{gp}"),
    ("/api/global-parameters/{name}", "PUT"): Row("/api/global-parameters/{gp}", {"value": "v"}),
    ("/api/global-parameters/{name}", "DELETE"): Row("/api/global-parameters/{dgp}", restore="global_parameter_dgp"),
    ("/api/shovels", "GET"): Row("/api/shovels"),
    ("/api/shovels/{vhost}", "GET"): Row("/api/shovels/{V}"),
    ("/api/shovels/vhost/{vhost}/{name}", "GET"): Row("/api/shovels/vhost/{V}/no-such-shovel"),
    ("/api/shovels/vhost/{vhost}/{name}", "DELETE"): Row("/api/shovels/vhost/{V}/no-such-shovel",
                                                         deviation=SHOVEL_CHANGE),
    ("/api/shovels/vhost/{vhost}/{name}/restart", "DELETE"): Row("/api/shovels/vhost/{V}/no-such-shovel/restart",
                                                                 deviation=SHOVEL_CHANGE),
    ("/api/federation-links", "GET"): Row("/api/federation-links"),
    ("/api/federation-links/{vhost}", "GET"): Row("/api/federation-links/{V}"),
    ("/api/vhost-limits", "GET"): Row("/api/vhost-limits"),
    ("/api/vhost-limits/{vhost}", "GET"): Row("/api/vhost-limits/{V}"),
    ("/api/vhost-limits/{vhost}/{name}", "PUT"): Row("/api/vhost-limits/{V}/max-connections", {"value": 1000}),
    ("/api/vhost-limits/{vhost}/{name}", "DELETE"): Row("/api/vhost-limits/{V}/max-queues", restore="vhost_limit"),
    ("/api/user-limits", "GET"): Row("/api/user-limits"),
    ("/api/user-limits/{user}", "GET"): Row("/api/user-limits/{target}"),
    ("/api/user-limits/{user}/{name}", "PUT"): Row("/api/user-limits/{target}/max-connections", {"value": 1000}),
    ("/api/user-limits/{user}/{name}", "DELETE"): Row("/api/user-limits/{target}/max-channels", restore="user_limit"),
    ("/api/aliveness-test/{vhost}", "GET"): Row("/api/aliveness-test/{V}"),
    ("/api/health/checks/alarms", "GET"): Row("/api/health/checks/alarms"),
    ("/api/health/checks/local-alarms", "GET"): Row("/api/health/checks/local-alarms"),
    ("/api/health/checks/virtual-hosts", "GET"): Row("/api/health/checks/virtual-hosts"),
    ("/api/health/checks/certificate-expiration/{within}/{unit}", "GET"): Row(
        "/api/health/checks/certificate-expiration/1/days"),
    ("/api/health/checks/node-is-quorum-critical", "GET"): Row("/api/health/checks/node-is-quorum-critical"),
    ("/api/health/checks/node-is-mirror-sync-critical", "GET"): Row("/api/health/checks/node-is-mirror-sync-critical"),
    ("/api/health/checks/port-listener/{port}", "GET"): Row("/api/health/checks/port-listener/{amqp_port}"),
    ("/api/health/checks/protocol-listener/{protocol}", "GET"): Row("/api/health/checks/protocol-listener/amqp"),
    # hutch's own routes: bodies a handler refuses (400) after the authorisation check, so nothing changes
    ("/api/hutch/vm-memory-high-watermark", "PUT"): Row("/api/hutch/vm-memory-high-watermark", {}, hutch=(A, None)),
    ("/api/hutch/cluster", "GET"): Row("/api/hutch/cluster", hutch=(MON, None)),
    ("/api/hutch/cluster/nodes/{node}", "DELETE"): Row("/api/hutch/cluster/nodes/no-such-node", hutch=(A, None)),
    ("/api/hutch/cluster/transfer-leadership", "POST"): Row("/api/hutch/cluster/transfer-leadership", {},
                                                            hutch=(A, None)),
    ("/api/hutch/cluster/rebalance", "POST"): Row("/api/hutch/cluster/rebalance", {}, hutch=(A, None)),
    ("/api/hutch/disk-free-limit", "PUT"): Row("/api/hutch/disk-free-limit", {}, hutch=(A, None)),
    ("/api/hutch/trace/{vhost}", "PUT"): Row("/api/hutch/trace/{V}", {"enabled": "neither"}, hutch=(A, None)),
    ("/api/queues/{vhost}/{name}/peek", "GET"): Row("/api/queues/{V}/{q}/peek", hutch=(M, "messages")),
    ("/api/queues/{vhost}/{name}/move", "POST"): Row("/api/queues/{V}/{q}/move", {"destination": {"queue": "dq"}},
                                                                    hutch=(M, "messages")),
    ("/api/hutch/dead-letters/{vhost}", "GET"): Row("/api/hutch/dead-letters/{V}", hutch=(M, "vhost")),
    ("/api/hutch/streams/{vhost}/{name}", "GET"): Row("/api/hutch/streams/{V}/{q}", hutch=(M, "messages")),
    ("/api/hutch/mqtt/sessions", "GET"): Row("/api/hutch/mqtt/sessions", hutch=(M, None)),
    ("/api/hutch/mqtt/sessions/{vhost}", "GET"): Row("/api/hutch/mqtt/sessions/{V}", hutch=(M, "vhost")),
    ("/api/hutch/mqtt/sessions/{vhost}/{client_id}", "GET"): Row("/api/hutch/mqtt/sessions/{V}/no-such-client",
                                                                 hutch=(M, "vhost")),
    ("/api/hutch/mqtt/sessions/{vhost}/{client_id}", "DELETE"): Row("/api/hutch/mqtt/sessions/{V}/no-such-client",
                                                                    hutch=(M, "vhost")),
}
