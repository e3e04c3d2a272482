"""Policies: named rules that give queues and exchanges settings by name pattern.

A policy has a pattern (a regular expression searched in the name, as
RabbitMQ's re:run), what it applies to ("queues", "exchanges" or "all"), a
priority and a definition (the keys in DEFINITION_KEYS). Exactly one policy
applies to a queue or exchange: among those whose pattern matches its name
and whose apply-to covers its kind, the one with the highest priority (ties
go to the name that sorts first: RabbitMQ's tie-break is its table's hash
order, which nothing can rely on; this one is at least deterministic). Definitions are validated as RabbitMQ does, with its
error texts. How a policy combines with a queue's own x-arguments is the
queue's business (`Queue.apply_policy`); for exchanges, the
"alternate-exchange" argument wins over the policy's (`Exchange.alternate_exchange`).

Operator policies (`OperatorPolicy`, RabbitMQ's operator policy overrides)
are a second set, chosen the same way, which only an administrator sets and
which only caps a queue's numeric limits (`OPERATOR_KEYS`); `effective`
combines the two definitions as RabbitMQ's rabbit_policy does: for each such
key the smaller value wins, and the queue's own x-arguments are then held
to the result the same way (vhosts.queue_arguments.effective).

The keys "federation-upstream" and "federation-upstream-set" name what
federates an exchange or queue (amqp_server.links.federation).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from vhosts.errors import erl_term
from vhosts.queue_location import LEADER_LOCATORS, MASTER_LOCATORS
from vhosts.stream_arguments import duration

APPLY_TO = ("queues", "exchanges", "all")
OVERFLOW = ("drop-head", "reject-publish", "reject-publish-dlx")


def _string(value: object) -> bool:
    return isinstance(value, str)


def _at_least(minimum: int):
    def check(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    return check


def _overflow(value: object) -> bool:
    return isinstance(value, str) and value in OVERFLOW




# key -> (validator, what a failing value is not: "<value> is not a valid <what>")
DEFINITION_KEYS = {
    "alternate-exchange": (_string, "alternate exchange name"),
    "dead-letter-exchange": (_string, "dead letter exchange name"),
    "dead-letter-routing-key": (_string, "dead letter routing key"),
    "message-ttl": (_at_least(0), "message TTL"),
    "expires": (_at_least(1), "queue expiry"),
    "max-length": (_at_least(0), "maximum length"),
    "max-length-bytes": (_at_least(0), "maximum length in bytes"),
    "overflow": (_overflow, "overflow value"),
    "delivery-limit": (_at_least(0), "delivery limit"),
    "federation-upstream": (_string, "federation upstream name"),
    "federation-upstream-set": (_string, "federation upstream set name"),
    "max-age": (lambda value: duration(value) is not None, "max age"),
    "stream-max-segment-size-bytes": (_at_least(0), "segment size"),
    # where a new queue's leader goes (vhosts.queue_location), worded as rabbitmqctl words them
    "queue-leader-locator": (lambda value: isinstance(value, str) and value in LEADER_LOCATORS,
                             "queue leader locator value"),
    "queue-master-locator": (lambda value: isinstance(value, str) and value in MASTER_LOCATORS,
                             "%s invalid queue-master-locator value"),
}

# What an operator policy may set (RabbitMQ 3.10's list); each caps the
# queue's own setting (the smaller value wins).
OPERATOR_KEYS = {key: DEFINITION_KEYS[key] for key in (
    "expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit")}
OPERATOR_WITHOUT_EFFECT = frozenset({"max-in-memory-length", "max-in-memory-bytes"})


# Keys RabbitMQ 3.10 recognises for features hutch does not have (mirroring,
# lazy mode, quorum queues): accepted, so that definitions exported from
# RabbitMQ import, and without effect.
WITHOUT_EFFECT = frozenset({
    "ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size", "ha-promote-on-shutdown",
    "ha-promote-on-failure", "queue-mode", "max-in-memory-length",
    "max-in-memory-bytes",
})


def validate_definition(definition: object, keys: dict = DEFINITION_KEYS,
                        without_effect: frozenset = WITHOUT_EFFECT) -> dict:
    """The definition, or ValueError with rabbitmqctl's reason."""
    if not isinstance(definition, dict) or not definition:
        raise ValueError("no policy provided")
    unknown = [(k, v) for k, v in definition.items() if k not in keys and k not in without_effect]
    if unknown:
        raise ValueError("[%s] are not recognised policy settings"
                         % ",".join("{%s,%s}" % (erl_term(k), erl_term(v)) for k, v in unknown))
    for key, value in definition.items():
        if key in without_effect:
            continue
        check, what = keys[key]
        if not check(value):
            raise ValueError(what % erl_term(value) if "%s" in what else
                             "%s is not a valid %s" % (erl_term(value), what))
    if "federation-upstream" in definition and "federation-upstream-set" in definition:
        raise ValueError("cannot specify federation-upstream, federation-upstream-set or "
                         "federation-upstream-pattern together")
    return dict(definition)


@dataclass
class Policy:
    vhost: str
    name: str
    pattern: str
    definition: dict
    priority: int = 0
    apply_to: str = "all"
    _regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.apply_to not in APPLY_TO:
            raise ValueError("apply-to '%s' unrecognised; should be 'queues', 'exchanges' or 'all'" % self.apply_to)
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValueError("priority must be an integer, got %s" % erl_term(self.priority))
        try:
            self._regex = re.compile(self.pattern)
        except re.error as exc:
            raise ValueError("pattern should be regular expression but is invalid: %s" % exc) from None
        self.definition = self._validate(self.definition)

    @staticmethod
    def _validate(definition: object) -> dict:
        return validate_definition(definition)

    def applies(self, kind: str, name: str) -> bool:
        """`kind`: "queue" or "exchange"."""
        return self.apply_to in ("all", kind + "s") and self._regex.search(name) is not None


class OperatorPolicy(Policy):
    """An operator policy override: only `OPERATOR_KEYS`."""

    @staticmethod
    def _validate(definition: object) -> dict:
        return validate_definition(definition, OPERATOR_KEYS, OPERATOR_WITHOUT_EFFECT)


def effective(policy: Policy | None, operator_policy: Policy | None) -> dict | None:
    """The definition a queue or exchange runs with: the policy's, each
    operator key capped by the operator policy's (the smaller wins)."""
    if operator_policy is None:
        return policy.definition if policy is not None else None
    merged = dict(policy.definition) if policy is not None else {}
    for key, value in operator_policy.definition.items():
        if key in OPERATOR_KEYS:
            merged[key] = min(merged[key], value) if key in merged else value
    return merged


def matching(policies, kind: str, name: str) -> Policy | None:
    """The one policy that applies to the `kind` named `name`, if any."""
    best = None
    for policy in policies:
        if policy.applies(kind, name) and (
                best is None or (-policy.priority, policy.name) < (-best.priority, best.name)):
            best = policy
    return best
