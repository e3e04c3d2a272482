"""Authorisation by user tags, as RabbitMQ's management plugin does it.

- management: may use the API, and sees the vhosts it has permissions in,
  its own connections and channels;
- policymaker: management + policies and parameters in its vhosts;
- monitoring: management + every vhost, connection and channel (read only),
  nodes;
- administrator: everything (users, vhosts, permissions, definitions).
A user without one of these tags cannot use the API at all. Writing to a
vhost needs a permission entry in it, whatever the tags.
"""
from __future__ import annotations

from amqp_server.management.errors import not_authorised, not_found

MANAGEMENT, POLICYMAKER, MONITORING, ADMINISTRATOR = "management", "policymaker", "monitoring", "administrator"

# tag a route requires -> the tags that satisfy it, and RabbitMQ's refusal
_GRANTED_BY = {
    MANAGEMENT: ({MANAGEMENT, POLICYMAKER, MONITORING, ADMINISTRATOR}, "Not management user"),
    POLICYMAKER: ({POLICYMAKER, ADMINISTRATOR}, "Not policymaker user"),
    MONITORING: ({MONITORING, ADMINISTRATOR}, "Not monitor user"),
    ADMINISTRATOR: ({ADMINISTRATOR}, "Not administrator user"),
}


def has(user, tag: str) -> bool:
    return not _GRANTED_BY[tag][0].isdisjoint(user.tags)


def require(user, tag: str) -> None:
    """The user may use the API (any management tag) and this route's tag."""
    for needed in (MANAGEMENT, tag):
        if not has(user, needed):
            raise not_authorised(_GRANTED_BY[needed][1])


def sees_everything(user) -> bool:
    """Monitoring and administrator users see every vhost and connection."""
    return has(user, MONITORING)


def visible_vhosts(user, broker) -> list:
    """The vhosts this user may list, by name."""
    if sees_everything(user):
        return [broker.vhosts[name] for name in sorted(broker.vhosts)]
    return [broker.vhosts[name] for name in sorted(broker.vhosts) if name in user.permissions]


def vhost(request, name: str):
    """A vhost the request may use: 404 when it does not exist; then a
    permission in it or the administrator tag (RabbitMQ's
    is_authorized_vhost: a monitoring user lists every vhost's objects in
    /api/queues and the like, but reads one vhost's only with a permission
    there). The operation itself is then checked as its AMQP method is."""
    found = request.broker.vhosts.get(name)
    if found is None:
        raise not_found()
    user = request.user
    if name in user.permissions or has(user, ADMINISTRATOR):
        return found
    raise not_authorised("User not authorised to access virtual host")


def visible_vhost(request, name: str):
    """A vhost whose status the user may read: 404 when it does not exist;
    a permission in it, or the monitoring tag (RabbitMQ's rule for limits,
    shovels and federation links of one vhost)."""
    found = request.broker.vhosts.get(name)
    if found is None:
        raise not_found()
    if name in request.user.permissions or sees_everything(request.user):
        return found
    raise not_authorised("User not authorised to access virtual host")


def owned(user, connection):
    """A connection the user may see (its own, or any for monitoring and
    administrator users); RabbitMQ's 401 for someone else's."""
    if not owns(user, connection):
        raise not_authorised("User not authorised to access object")
    return connection


def policy_vhost(request):
    """The vhost of a route on one policy or one parameter (RabbitMQ's
    is_authorized_policies, shared by both): any for an administrator; for a
    policymaker, one it has a permission in. None for a vhost that does not
    exist, which is the route's 404 (a policymaker is refused only where the
    vhost exists)."""
    name, user = request.params["vhost"], request.user
    if not has(user, ADMINISTRATOR) and (
            not has(user, POLICYMAKER) or (name in request.broker.vhosts and name not in user.permissions)):
        raise not_authorised("User not authorised to access object")
    return request.broker.vhosts.get(name)


def owns(user, connection) -> bool:
    """Connections (and their channels) a user may see and close."""
    return sees_everything(user) or (connection.user is not None and connection.user.name == user.name)
