"""Who may point a link at which vhost of this broker.

A link connects to a URI without a host ("amqp:///b") as this broker's
default user (amqp_server.links.client.resolve), and to a URI naming this
broker's own listener from the loopback interface, where users such as guest
may log in. Either way it could reach a vhost that the user who set the
link may not. So, as RabbitMQ's shovel does for host-less URIs:

- when a user sets a shovel or (beyond RabbitMQ) a federation upstream, that
  user must be allowed to connect to every vhost of this broker its URIs
  name: the vhost exists and the user has a permission in it (RabbitMQ's
  check_vhost_access). Refused, the parameter is refused with RabbitMQ's
  line `user "u" may not connect to vhost "v"` (`may_connect`, given to
  vhosts.parameters.validate);
- the broker remembers that user as the parameter's owner
  (`VirtualHost.parameter_owners`, stored with the definitions), and a link
  checks the owner again before every session and while it runs
  (`refusal`): an owner that was deleted or lost its permission stops the
  link, with the reason in its status, until access comes back. A
  parameter without owner (set before owners were kept) is the broker's
  own and is not checked.

"This broker" is a URI without a host, or one whose host is a loopback or
unspecified address, "localhost", this machine's name or the address the
AMQP listener is bound to, with the port of its AMQP or AMQPS listener
(5672 when none is given for amqp://, 5671 for amqps://).
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from vhosts.parameters import uri_vhost

_DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}


def names_this_broker(uri: str, local) -> bool:
    """Whether `uri` (a valid AMQP URI) leads to this broker (`local`, a
    client.LocalNode)."""
    parts = urlsplit(uri)
    host = parts.hostname
    if not host:
        return True
    if (parts.port or _DEFAULT_PORTS.get(parts.scheme)) not in (local.port, local.tls_port):
        return False
    if host in ("localhost", local.host, socket.gethostname()):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def vhost_refusal(broker, user_name: str, vhost: str) -> str | None:
    """RabbitMQ's line when `user_name` may not connect to `vhost`, else None."""
    user = broker.users.get(user_name)
    if vhost in broker.vhosts and user is not None and vhost in user.permissions:
        return None
    return 'user "%s" may not connect to vhost "%s"' % (user_name, vhost)


def may_connect(broker, local, user_name: str):
    """The `may_connect(uri)` check of vhosts.parameters.validate for a
    user setting a parameter."""
    def check(uri: str) -> str | None:
        if not names_this_broker(uri, local):
            return None
        return vhost_refusal(broker, user_name, uri_vhost(uri))
    return check


def refusal(broker, local, owner: str | None, uris) -> str | None:
    """Why the link whose parameter `owner` set may not connect to `uris`
    any more, or None."""
    if owner is None:
        return None
    if owner not in broker.users:
        return 'the user who set it, "%s", no longer exists' % owner
    check = may_connect(broker, local, owner)
    for uri in uris:
        problem = check(uri)
        if problem is not None:
            return "the user who set it lost access: " + problem
    return None
