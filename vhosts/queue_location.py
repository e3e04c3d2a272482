"""Where a new queue's leader goes: RabbitMQ 3.10's queue leader locators.

A quorum queue or a stream takes `x-queue-leader-locator` (or a policy's
`queue-leader-locator`), a classic queue `x-queue-master-locator` (or
`queue-master-locator`); the argument wins over the policy, as in
RabbitMQ. Their values come down to two placements:
- CLIENT_LOCAL: with the connection that declares the queue (on a node of
  several shards its shard, which in a cluster the node the client reached
  leads: docs/scaling.md);
- BALANCED: where the fewest queues of the vhost are (RabbitMQ's
  "balanced", and its older "least-leaders", "min-masters" and "random").
hutch's default is BALANCED whatever the type, which spreads the queues,
and with them the work, over every shard and node: RabbitMQ's default is
client-local, which leaves every queue on the node its declaring clients
happen to reach (docs/scaling.md says so).
"""
from __future__ import annotations

from vhosts.errors import field_type

CLIENT_LOCAL, BALANCED = "client-local", "balanced"
# RabbitMQ 3.10.8 accepts these (checked against it: "min-masters" is refused here).
LEADER_LOCATORS = {"client-local": CLIENT_LOCAL, "balanced": BALANCED, "random": BALANCED,
                   "least-leaders": BALANCED}
MASTER_LOCATORS = {"client-local": CLIENT_LOCAL, "min-masters": BALANCED, "random": BALANCED}


def leader_locator_problem(value: object) -> str | None:
    """x-queue-leader-locator's problem, as RabbitMQ words it, or None."""
    if not isinstance(value, str):
        return "{unacceptable_type,%s}" % field_type(value)
    return None if value in LEADER_LOCATORS else "invalid_queue_locator_arg"


def master_locator_problem(value: object) -> str | None:
    """x-queue-master-locator's problem, or None. (RabbitMQ 3.10 fails such
    a declare with 541 INTERNAL_ERROR, closing the connection; hutch
    answers 406 on the channel, with leader locator's reason.)"""
    if not isinstance(value, str):
        return "{unacceptable_type,%s}" % field_type(value)
    return None if value in MASTER_LOCATORS else "invalid_queue_locator_arg"


def placement(arguments: dict, policy: dict | None) -> str:
    """CLIENT_LOCAL or BALANCED for a queue declared with (validated)
    `arguments` under `policy` (its effective definition, or None)."""
    classic = arguments.get("x-queue-type", "classic") == "classic"
    key, values = ("queue-master-locator", MASTER_LOCATORS) if classic else ("queue-leader-locator", LEADER_LOCATORS)
    chosen = arguments.get("x-" + key)
    if chosen is None and policy is not None:
        chosen = policy.get(key)
    return values.get(chosen, BALANCED) if isinstance(chosen, str) else BALANCED
