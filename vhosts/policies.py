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
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from vhosts.errors import erl_term
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
    "max-age": (lambda value: duration(value) is not None, "max age"),
    "stream-max-segment-size-bytes": (_at_least(0), "segment size"),
}


# Keys RabbitMQ 3.10 recognises for features hutch does not have (mirroring,
# lazy mode, quorum queues): accepted, so that definitions exported from
# RabbitMQ import, and without effect.
WITHOUT_EFFECT = frozenset({
    "ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size", "ha-promote-on-shutdown",
    "ha-promote-on-failure", "queue-mode", "queue-master-locator", "max-in-memory-length",
    "max-in-memory-bytes",
})


def validate_definition(definition: object) -> dict:
    """The definition, or ValueError with rabbitmqctl's reason."""
    if not isinstance(definition, dict) or not definition:
        raise ValueError("no policy provided")
    unknown = [(k, v) for k, v in definition.items() if k not in DEFINITION_KEYS and k not in WITHOUT_EFFECT]
    if unknown:
        raise ValueError("[%s] are not recognised policy settings"
                         % ",".join("{%s,%s}" % (erl_term(k), erl_term(v)) for k, v in unknown))
    for key, value in definition.items():
        if key in WITHOUT_EFFECT:
            continue
        check, what = DEFINITION_KEYS[key]
        if not check(value):
            raise ValueError("%s is not a valid %s" % (erl_term(value), what))
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
        self.definition = validate_definition(self.definition)

    def applies(self, kind: str, name: str) -> bool:
        """`kind`: "queue" or "exchange"."""
        return self.apply_to in ("all", kind + "s") and self._regex.search(name) is not None


def matching(policies, kind: str, name: str) -> Policy | None:
    """The one policy that applies to the `kind` named `name`, if any."""
    best = None
    for policy in policies:
        if policy.applies(kind, name) and (
                best is None or (-policy.priority, policy.name) < (-best.priority, best.name)):
            best = policy
    return best
