"""Definitions export and import in RabbitMQ's format (GET/POST /api/definitions).

Export lists users (with their salted SHA-256 hashes, RabbitMQ's default
scheme, so they log in wherever the file is imported, and their limits),
vhosts (with their description and tags in a "metadata" object, the shape
of RabbitMQ 3.11 and later; import also takes them as top-level keys, as
RabbitMQ does), permissions, topic permissions, vhost limits (as RabbitMQ exports
them: a "parameters" entry of component "vhost-limits" named "limits"),
runtime parameters (shovels, federation upstreams and sets; operator
policies, as RabbitMQ 3.10 exports them: component "operator_policy"), global
parameters, policies, non-exclusive queues, exchanges other than the predeclared ones,
and the explicit bindings. Import accepts hutch's own export and
RabbitMQ's: every entry is checked before anything is changed, then applied
in the order RabbitMQ uses (users, vhosts, permissions, topic permissions,
parameters, policies, then exchanges, queues, bindings) through the same
domain calls as AMQP and the management API, each durable change in its own
store transaction. Parameters of components hutch does not know are
refused with RabbitMQ's "component ... not found", before anything changes.
The global parameter internal_cluster_id is the importing node's own and is
kept (another node's would make two nodes' federation queues one).
The import gives the event loop a turn every STEP entries, so that a large
document neither stalls the node's clients nor silences its shard links.
"""
from __future__ import annotations

import asyncio

from routing import Destination
from vhosts.errors import AMQPError
from vhosts.policies import OperatorPolicy, Policy
from vhosts.users import USER_LIMITS, VHOST_LIMITS, Permission, check_limits, check_pattern, hash_password

from vhosts.parameters import validate as validate_parameter

from amqp_server.management import accounts, parameters, policies, resources, topic_permissions
from amqp_server.management.errors import ApiError, bad_request
from amqp_server.management.http import NO_CONTENT
from amqp_server.management.node import COMPATIBLE_VERSION


VHOST_LIMITS_COMPONENT = parameters.VHOST_LIMITS
# RabbitMQ 3.10 exports an operator policy as a parameter of this component.
OPERATOR_POLICY_COMPONENT = "operator_policy"
# Entries applied in one turn of the event loop: a turn that runs longer than the
# shard links' heartbeat timeout (shard_timeout) would have this shard fenced.
STEP = 100


def _queues(v, with_vhost: bool) -> list[dict]:
    out = []
    for name in sorted(v.queues):
        q = v.queues[name]
        if q.exclusive_owner is not None:
            continue
        item = {"name": name, "vhost": v.name, "durable": q.durable, "auto_delete": q.auto_delete,
                "arguments": q.arguments}
        out.append(item if with_vhost else _without_vhost(item))
    return out


def _exchanges(v, with_vhost: bool) -> list[dict]:
    out = []
    for name in sorted(v.exchanges):
        x = v.exchanges[name]
        if x.builtin:
            continue
        item = {"name": name, "vhost": v.name, "type": x.type, "durable": x.durable, "auto_delete": x.auto_delete,
                "internal": x.internal, "arguments": x.arguments}
        out.append(item if with_vhost else _without_vhost(item))
    return out


def _bindings(v, with_vhost: bool) -> list[dict]:
    out = []
    for source, dest, key, args in v.bindings():
        item = {"source": source, "vhost": v.name, "destination": dest.name, "destination_type": dest.kind,
                "routing_key": key, "arguments": args or {}}
        out.append(item if with_vhost else _without_vhost(item))
    out.sort(key=lambda b: (b["source"], b["destination_type"], b["destination"], b["routing_key"]))
    return out


def _without_vhost(item: dict) -> dict:
    return {key: value for key, value in item.items() if key != "vhost"}


def _policies(v) -> list[dict]:
    return [policies.shape(v.policies[name]) for name in sorted(v.policies)]


def _operator_policies(v, with_vhost: bool) -> list[dict]:
    """The vhost's operator policies as RabbitMQ exports them: parameters."""
    out = []
    for name in sorted(v.operator_policies):
        policy = v.operator_policies[name]
        item = {"value": {"pattern": policy.pattern, "definition": policy.definition, "priority": policy.priority,
                          "apply-to": policy.apply_to},
                "vhost": v.name, "component": OPERATOR_POLICY_COMPONENT, "name": name}
        out.append(item if with_vhost else _without_vhost(item))
    return out


def export_all(broker) -> dict:
    users = [broker.users[name] for name in sorted(broker.users)]
    vhosts = [broker.vhosts[name] for name in sorted(broker.vhosts)]
    return {
        "rabbit_version": COMPATIBLE_VERSION,
        "rabbitmq_version": COMPATIBLE_VERSION,
        "product_name": "hutch",
        "product_version": COMPATIBLE_VERSION,
        "users": [{"name": u.name, "password_hash": u.password_hash,
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": list(u.tags),
                   "limits": dict(u.limits)}
                  for u in users],
        "vhosts": [{"name": v.name, "metadata": {"description": v.description, "tags": list(v.tags)}}
                   for v in vhosts],
        "permissions": [{"user": u.name, "vhost": name, "configure": p.configure, "write": p.write, "read": p.read}
                        for u in users for name, p in sorted(u.permissions.items())],
        "topic_permissions": [topic_permissions.shape(u.name, vhost, rule)
                              for u in users for (vhost, _x), rule in sorted(u.topic_permissions.items())],
        "parameters": [item for v in vhosts for item in
                       parameters.vhost_parameters(broker, v, owners=True) + _operator_policies(v, True)],
        "global_parameters": [{"name": name, "value": value}
                              for name, value in sorted(broker.global_parameters.items())],
        "policies": [item for v in vhosts for item in _policies(v)],
        "queues": [item for v in vhosts for item in _queues(v, True)],
        "exchanges": [item for v in vhosts for item in _exchanges(v, True)],
        "bindings": [item for v in vhosts for item in _bindings(v, True)],
    }


def export_vhost(broker, v) -> dict:
    return {
        "rabbit_version": COMPATIBLE_VERSION,
        "parameters": parameters.vhost_parameters(broker, v, owners=True) + _operator_policies(v, False),
        "policies": _policies(v),
        "queues": _queues(v, False),
        "exchanges": _exchanges(v, False),
        "bindings": _bindings(v, False),
    }


def get_definitions(req) -> dict:
    return export_all(req.broker)


def get_vhost_definitions(req) -> dict:
    return export_vhost(req.broker, req.vhost(req.params["vhost"]))


# -- import -------------------------------------------------------------------


def _section(body: dict, name: str) -> list[dict]:
    items = body.get(name) or []
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise bad_request("%s must be a list of objects" % name)
    return items


def _text(item: dict, key: str, default: str | None = None) -> str:
    value = item.get(key, default)
    if not isinstance(value, str):
        raise bad_request("[{key_missing,%s}]" % key if value is None else "%s must be a string" % key)
    return value


def _check(body: dict, vhost_name: str | None, known_vhosts: set) -> dict:
    """Every section as a list of plain entries, or 400 before any change."""
    checked = {name: _section(body, name) for name in
               ("users", "vhosts", "permissions", "topic_permissions", "parameters", "policies", "exchanges",
                "queues", "bindings")}
    if vhost_name is not None:
        for name in ("parameters", "policies", "exchanges", "queues", "bindings"):
            checked[name] = [dict(item, vhost=vhost_name) for item in checked[name]]
        checked["users"] = checked["vhosts"] = checked["permissions"] = checked["topic_permissions"] = []
    vhosts = known_vhosts | {_text(item, "name") for item in checked["vhosts"]}
    for item in checked["vhosts"]:
        accounts.vhost_metadata(item)
    for user in checked["users"]:
        _text(user, "name")
        accounts.tags_from(user.get("tags", []))
        if "password_hash" in user:
            accounts.imported_hash(user)
        elif "password" in user:
            _text(user, "password")
        _valid(check_limits, user.get("limits") or {}, USER_LIMITS)
    checked["global_parameters"] = [] if vhost_name is not None else _section(body, "global_parameters")
    for item in checked["global_parameters"]:
        _text(item, "name")
        if "value" not in item:
            raise bad_request("[{key_missing,value}]")
    for name in ("permissions", "topic_permissions", "parameters", "policies", "exchanges", "queues", "bindings"):
        for item in checked[name]:
            target = item.get("vhost")
            if target not in vhosts:
                raise bad_request("[no_such_vhost,%s]" % (target if isinstance(target, str) else "undefined"))
    for item in checked["permissions"]:
        for key in ("user", "configure", "write", "read"):
            _text(item, key)
    for item in checked["topic_permissions"]:
        for key in ("user", "exchange", "write", "read"):
            _text(item, key)
        for key in ("write", "read"):
            _valid(check_pattern, item[key])
    checked["operator_policies"] = [item for item in checked["parameters"]
                                    if item.get("component") == OPERATOR_POLICY_COMPONENT]
    checked["parameters"] = [item for item in checked["parameters"] if item not in checked["operator_policies"]]
    for item in checked["operator_policies"]:
        value = item.get("value")
        if not isinstance(value, dict):
            raise bad_request("Validation failed\n\noperator policy value must be an object\n")
        _valid(OperatorPolicy, item["vhost"], _text(item, "name"), _text(value, "pattern"), value.get("definition"),
               value.get("priority", 0), value.get("apply-to", "all"))
    for item in checked["parameters"]:
        value = item.get("value")
        component = _text(item, "component")
        if component != VHOST_LIMITS_COMPONENT:
            errors = validate_parameter(component, _text(item, "name"), value)
            if errors:
                raise bad_request("Validation failed\n\n%s\n" % "\n".join(errors))
            continue
        if value == []:  # how RabbitMQ exports limits that were all cleared
            item["value"] = value = {}
        if not isinstance(value, dict):
            raise bad_request("vhost-limits value must be an object")
        _valid(check_limits, value, VHOST_LIMITS)
    for item in checked["policies"]:
        _valid(Policy, item["vhost"], _text(item, "name"), _text(item, "pattern"), item.get("definition"),
               item.get("priority", 0), item.get("apply-to", "all"))
    for item in checked["exchanges"] + checked["queues"]:
        _text(item, "name")
        resources.arguments_of(item)
    for item in checked["bindings"]:
        for key in ("source", "destination", "destination_type"):
            _text(item, key)
        if item["destination_type"] not in ("queue", "exchange"):
            raise bad_request("destination_type must be queue or exchange")
        _text(item, "routing_key", "")
        resources.arguments_of(item)
    return checked


def _valid(check, *args) -> None:
    """Run a domain validation; its ValueError is a 400 with its reason."""
    try:
        check(*args)
    except ValueError as exc:
        raise bad_request(str(exc)) from None


def _known_user(broker, name: str) -> str:
    if name not in broker.users:
        raise bad_request("[no_such_user,%s]" % name)
    return name


async def _stepped(items: list):
    """The items, with a turn of the event loop after every STEP of them."""
    for index, item in enumerate(items):
        if index and index % STEP == 0:
            await asyncio.sleep(0)
        yield item


def _vhost(broker, name: str):
    """A vhost of the document; one deleted while the import gave the loop a turn is refused."""
    if name not in broker.vhosts:
        raise bad_request("[no_such_vhost,%s]" % name)
    return broker.vhosts[name]


async def apply(broker, body: dict, vhost_name: str | None = None, acting_user: str | None = None) -> None:
    """Import `body` (a definitions document) into `broker`; the acting user
    (of an API import) gets full permissions on each vhost it creates, as on
    RabbitMQ, before the document's own permissions are applied."""
    checked = _check(body, vhost_name, set(broker.vhosts))
    for user in checked["users"]:
        if "password_hash" in user:
            password_hash = accounts.imported_hash(user)
        else:
            password_hash = hash_password(user["password"]) if "password" in user else ""
        broker.put_user(user["name"], password_hash, accounts.tags_from(user.get("tags", [])))
        if user.get("limits"):
            broker.set_user_limits(user["name"], user["limits"])
    for item in checked["vhosts"]:
        broker.add_vhost(item["name"], *accounts.vhost_metadata(item), acting_user=acting_user)
    for item in checked["permissions"]:
        broker.set_permissions(_known_user(broker, item["user"]), item["vhost"],
                               Permission(item["configure"], item["write"], item["read"]))
    for item in checked["topic_permissions"]:
        broker.set_topic_permissions(_known_user(broker, item["user"]), item["vhost"], item["exchange"],
                                     item["write"], item["read"])
    for item in checked["global_parameters"]:
        if item["name"] != "internal_cluster_id":  # this node's identity (names its federation queues upstream)
            broker.set_global_parameter(item["name"], item["value"])
    for item in checked["parameters"]:
        if item["component"] == VHOST_LIMITS_COMPONENT:
            broker.set_vhost_limits(item["vhost"], item["value"])
        else:
            # who set it, as exported; else the importing user (RabbitMQ checks neither at import:
            # the link checks its owner's access when it starts, amqp_server.links.access)
            owner = item.get(parameters.OWNER, acting_user)
            broker.set_parameter(item["vhost"], item["component"], item["name"], item["value"],
                                 owner=owner if isinstance(owner, str) else acting_user)
    for item in checked["operator_policies"]:
        value = item["value"]
        broker.set_policy(item["vhost"], item["name"], value["pattern"], value["definition"], value.get("priority", 0),
                          value.get("apply-to", "all"), operator=True)
    for item in checked["policies"]:
        broker.set_policy(item["vhost"], item["name"], item["pattern"], item["definition"], item.get("priority", 0),
                          item.get("apply-to", "all"))
    try:
        async for item in _stepped(checked["exchanges"]):
            _vhost(broker, item["vhost"]).declare_exchange(
                item["name"], item.get("type", "direct"), durable=bool(item.get("durable", True)),
                auto_delete=bool(item.get("auto_delete", False)), internal=bool(item.get("internal", False)),
                arguments=resources.arguments_of(item))
        async for item in _stepped(checked["queues"]):
            _vhost(broker, item["vhost"]).declare_queue(
                item["name"], None, durable=bool(item.get("durable", True)),
                auto_delete=bool(item.get("auto_delete", False)), arguments=resources.arguments_of(item))
        async for item in _stepped(checked["bindings"]):
            v = _vhost(broker, item["vhost"])
            dest = Destination(item["destination_type"], item["destination"])
            source, key, arguments = item["source"], item.get("routing_key", ""), resources.arguments_of(item)
            if dest.kind == "queue":
                v.bind_queue(dest.name, source, key, arguments, None)
            else:
                v.bind_exchange(dest.name, source, key, arguments)
    except AMQPError as exc:
        raise bad_request(exc.reply_text) from None


async def post_definitions(req):
    await apply(req.broker, _document(req), acting_user=req.user.name)
    return NO_CONTENT


async def post_vhost_definitions(req):
    name = req.params["vhost"]
    req.vhost(name)
    await apply(req.broker, _document(req), name, acting_user=req.user.name)
    return NO_CONTENT


def _document(req) -> dict:
    try:
        return req.body()
    except ApiError:
        raise bad_request("failed_to_parse_json") from None
