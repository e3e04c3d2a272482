"""Runtime parameters: values of a named component, per vhost, as RabbitMQ's
rabbit_runtime_parameters keeps them.

A parameter is (vhost, component, name) -> a JSON value. The components are
those of RabbitMQ's shovel and federation plugins (`COMPONENTS`): hutch runs
what they describe (amqp_server.links), and validates their values here as
RabbitMQ 3.10 does, with its texts, so a definition that RabbitMQ refuses is
refused the same way. ("vhost-limits", which RabbitMQ also exports as a
parameter, is the vhost's limits, not kept here.)

How RabbitMQ reports a bad value, and so this module: every check of a
component produces either nothing or one error line; the lines of the
cross-key checks (exactly one of src-queue and src-exchange...) come first,
then those of rabbit_parameter_validation:proplist, which walks its key
table in order, collects the errors in reverse, and puts "Unrecognised
terms" (the keys no entry took) in front. `validate(component, name, value)`
returns the lines; none means valid.

Who may point a link where: a link connects to a URI without a host
("amqp:///b") as the broker's default user, so RabbitMQ's shovel checks that
the user setting the parameter may connect to the vhost such a URI names
(`user "u" may not connect to vhost "b"`, in the URI's place among the error
lines). `validate` takes that check as `may_connect(uri)` (None: no user
to check, as for a definitions import); amqp_server.links.access
makes it, for shovels and, beyond RabbitMQ, federation upstreams, and for
URIs that name this broker's own listener too.
"""
from __future__ import annotations

from urllib.parse import unquote, urlsplit

from vhosts.errors import erl_term

SHOVEL = "shovel"
FEDERATION_UPSTREAM = "federation-upstream"
FEDERATION_UPSTREAM_SET = "federation-upstream-set"
COMPONENTS = (SHOVEL, FEDERATION_UPSTREAM, FEDERATION_UPSTREAM_SET)

ACK_MODES = ("no-ack", "on-publish", "on-confirm")

# The basic properties a shovel may set on what it publishes (dest-publish-properties).
PUBLISH_PROPERTIES = (
    "content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id", "reply_to",
    "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id",
)


# -- one value's checks: None, or the error line -----------------------------------


def _binary(key: str, value: object) -> str | None:
    if isinstance(value, str):
        return None
    return "%s should be binary, actually was %s" % (key, erl_term(value))


def _number(key: str, value: object) -> str | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None
    return "%s should be a number, actually was %s" % (key, erl_term(value))


def _boolean(key: str, value: object) -> str | None:
    if isinstance(value, bool):
        return None
    return "%s should be boolean, actually was %s" % (key, erl_term(value))


def _enum(*allowed: str):
    def check(key: str, value: object) -> str | None:
        if not isinstance(value, str):
            return _binary(key, value)
        if value in allowed:
            return None
        return "%s should be one of [%s], actually was %s" % (
            key, ",".join(erl_term(a) for a in allowed), erl_term(value))
    return check


def uri_problem(uri: object) -> str | None:
    """Why `uri` is not an AMQP URI RabbitMQ's amqp_uri would take, or None."""
    if not isinstance(uri, str):
        return "%s not a valid URI" % erl_term(uri)
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme not in ("amqp", "amqps"):
        return '"%s" not a valid URI: {{unexpected_uri_scheme,"%s"},"%s"}' % (uri, scheme, uri)
    try:
        urlsplit(uri).port
    except ValueError:
        return '"%s" not a valid URI: {unable_to_parse_uri,"%s"}' % (uri, uri)
    return None


def uri_vhost(uri: str) -> str:
    """The vhost an AMQP URI names, as the links' client (aiormq) reads it:
    "/" when the path is empty or "/", else the path's rest, unquoted."""
    path = urlsplit(uri).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def _uris(key: str, value: object, may_connect=None) -> str | None:
    """One URI or a list of them (a shovel or upstream tries them in turn):
    the first problem, a URI's syntax or its vhost (`may_connect`)."""
    for uri in [value] if isinstance(value, str) else value if isinstance(value, list) else ():
        problem = uri_problem(uri) if isinstance(uri, str) else _binary(key, uri)
        if problem is None and may_connect is not None:
            problem = may_connect(uri)
        if problem is not None:
            return problem
    if not isinstance(value, (str, list)):
        return "%s should be list, actually was %s" % (key, erl_term(value))
    return None


def _with_uris(table: tuple, may_connect) -> tuple:
    """A key table whose URI keys also check `may_connect`."""
    if may_connect is None:
        return table
    check = lambda key, value: _uris(key, value, may_connect)  # noqa: E731
    return tuple((key, check if test is _uris else test, mandatory) for key, test, mandatory in table)


def _delete_after(key: str, value: object) -> str | None:
    if value in ("never", "queue-length") or (
            isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return ('%s should be a number greater than or equal to 0, "never" or "queue-length", actually was %s'
            % (key, erl_term(value)))


def _publish_properties(key: str, value: object) -> str | None:
    if not isinstance(value, dict):
        return "%s not a list %s" % (key, erl_term(value))
    unknown = [(k, v) for k, v in value.items() if k not in PUBLISH_PROPERTIES]
    if unknown:
        return "Unrecognised terms [%s] in %s" % (
            ",".join("{%s,%s}" % (erl_term(k), erl_term(v)) for k, v in unknown), key)
    return None


def _protocol(key: str, value: object) -> str | None:
    """hutch's shovels speak AMQP 0-9-1 only (RabbitMQ also has "amqp10")."""
    problem = _enum("amqp091")(key, value)
    if problem is None:
        return None
    return problem + " (hutch's shovels speak AMQP 0-9-1 only)"


MANDATORY, OPTIONAL = True, False


def proplist(name: str, table: tuple, value: dict) -> list[str]:
    """rabbit_parameter_validation:proplist: the errors of `value` against
    `table` ((key, check, mandatory) in order), in RabbitMQ's order."""
    errors = []
    rest = dict(value)
    for key, check, mandatory in table:
        if key in rest:
            problem = check(key, rest.pop(key))
            if problem is not None:
                errors.append(problem)
        elif mandatory:
            errors.append('Key "%s" not found in %s' % (key, name))
    errors.reverse()
    if rest:
        errors.insert(0, "Unrecognised terms [%s] in %s" % (
            ",".join("{%s,%s}" % (erl_term(k), erl_term(v)) for k, v in rest.items()), name))
    return errors


# -- shovel --------------------------------------------------------------------------

_SHOVEL_KEYS = (
    ("reconnect-delay", _number, OPTIONAL),
    ("ack-mode", _enum(*ACK_MODES), OPTIONAL),
    ("src-protocol", _protocol, OPTIONAL),
    ("dest-protocol", _protocol, OPTIONAL),
    ("src-uri", _uris, MANDATORY),
    ("src-exchange", _binary, OPTIONAL),
    ("src-exchange-key", _binary, OPTIONAL),
    ("src-queue", _binary, OPTIONAL),
    ("prefetch-count", _number, OPTIONAL),  # before 3.7; src-prefetch-count since
    ("src-prefetch-count", _number, OPTIONAL),
    ("delete-after", _delete_after, OPTIONAL),
    ("src-delete-after", _delete_after, OPTIONAL),
    ("dest-uri", _uris, MANDATORY),
    ("dest-exchange", _binary, OPTIONAL),
    ("dest-exchange-key", _binary, OPTIONAL),
    ("dest-queue", _binary, OPTIONAL),
    ("add-forward-headers", _boolean, OPTIONAL),
    ("dest-add-forward-headers", _boolean, OPTIONAL),
    ("add-timestamp-header", _boolean, OPTIONAL),
    ("dest-add-timestamp-header", _boolean, OPTIONAL),
    ("publish-properties", _publish_properties, OPTIONAL),
    ("dest-publish-properties", _publish_properties, OPTIONAL),
)


def _shovel(name: str, value: dict, may_connect=None) -> list[str]:
    errors = []
    src = ("src-exchange" in value) + ("src-queue" in value)
    if src == 0:
        errors.append("Must specify 'src-exchange' or 'src-queue'")
    elif src == 2:
        errors.append("Cannot specify 'src-exchange' and 'src-queue'")
    delete_after = value.get("src-delete-after", value.get("delete-after"))
    if isinstance(delete_after, int) and not isinstance(delete_after, bool) and value.get("ack-mode") == "no-ack":
        errors.append("Cannot specify 'no-ack' and numerical 'delete-after'")
    if "dest-exchange" in value and "dest-queue" in value:
        errors.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    return errors + proplist(name, _with_uris(_SHOVEL_KEYS, may_connect), value)


# -- federation ----------------------------------------------------------------------

_UPSTREAM_KEYS = (
    ("exchange", _binary, OPTIONAL),
    ("queue", _binary, OPTIONAL),
    ("consumer-tag", _binary, OPTIONAL),
    ("prefetch-count", _number, OPTIONAL),
    ("reconnect-delay", _number, OPTIONAL),
    ("max-hops", _number, OPTIONAL),
    ("expires", _number, OPTIONAL),
    ("message-ttl", _number, OPTIONAL),
    ("trust-user-id", _boolean, OPTIONAL),
    ("ack-mode", _enum(*ACK_MODES), OPTIONAL),
    ("resource-cleanup-mode", _enum("default", "never"), OPTIONAL),
    ("ha-policy", _binary, OPTIONAL),
    ("bind-nowait", _boolean, OPTIONAL),
)


def _upstream(name: str, value: dict, may_connect=None) -> list[str]:
    return proplist(name, _with_uris((("uri", _uris, MANDATORY),) + _UPSTREAM_KEYS, may_connect), value)


def _upstream_set(name: str, value: object, _may_connect=None) -> list[str]:
    if not isinstance(value, list):
        return ["%s not a list %s" % (name, erl_term(value))]
    errors = []
    for member in value:
        if not isinstance(member, dict):
            errors.append("%s not a list %s" % (name, erl_term(member)))
            continue
        errors += proplist(name, (("upstream", _binary, MANDATORY),) + _UPSTREAM_KEYS, member)
    return errors


_VALIDATORS = {SHOVEL: _shovel, FEDERATION_UPSTREAM: _upstream, FEDERATION_UPSTREAM_SET: _upstream_set}


def validate(component: str, name: str, value: object, may_connect=None) -> list[str]:
    """RabbitMQ's error lines for this value (empty: valid). `may_connect(uri)`:
    None, or the error line when the user setting it may not use that URI."""
    check = _VALIDATORS.get(component)
    if check is None:
        return ["component %s not found" % component]
    if component != FEDERATION_UPSTREAM_SET and not isinstance(value, dict):
        # RabbitMQ 3.10 answers a 500 here; a plain reason is kinder.
        return ["%s not a list %s" % (name, erl_term(value))]
    return check(name, value, may_connect)


def as_list(value: object) -> list:
    """A key that takes one value or a list of them (src-uri, uri), as a list."""
    return list(value) if isinstance(value, list) else [value]
