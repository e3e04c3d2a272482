"""Validation of policies and limits, differential: the reason rabbitmqctl
prints for an invalid policy definition, apply-to or limit is the message of
the ValueError hutch's administration methods raise for the same input.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from helpers import unique
from vhosts import Broker

pytestmark = pytest.mark.differential


def rabbitmqctl_reason(*args: str) -> str:
    """The last line rabbitmqctl prints for a refused command."""
    done = subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, done.stdout
    return [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-1]


@pytest.fixture
def domain(rabbitmq_url) -> Broker:
    return Broker("guest", "guest", "/", [])


@pytest.mark.parametrize("definition", [
    {},
    {"foo": 1},
    {"message-ttl": "x"},
    {"message-ttl": -1},
    {"expires": 0},
    {"max-length": -1},
    {"max-length-bytes": 1.5},
    {"overflow": "bad"},
    {"dead-letter-exchange": 1},
    {"dead-letter-routing-key": True},
    {"alternate-exchange": 1},
    {"delivery-limit": "x"},
    {"max-age": "1x"},
    {"max-age": "0s"},
    {"stream-max-segment-size-bytes": -1},
    {"stream-max-segment-size-bytes": "a"},
    {"queue-leader-locator": "bogus"},
    {"queue-leader-locator": "min-masters"},
    {"queue-master-locator": "bogus"},
    {"queue-master-locator": "balanced"},
])
def test_policy_definitions(domain, definition):
    name = unique("diff-policy")
    expected = rabbitmqctl_reason("set_policy", name, "^%s$" % name, json.dumps(definition))
    with pytest.raises(ValueError) as info:
        domain.set_policy("/", name, "^%s$" % name, definition)
    assert str(info.value) == expected


def test_policy_apply_to(domain):
    name = unique("diff-policy")
    expected = rabbitmqctl_reason("set_policy", "--apply-to", "bogus", name, "^x$", '{"max-length": 1}')
    with pytest.raises(ValueError) as info:
        domain.set_policy("/", name, "^x$", {"max-length": 1}, apply_to="bogus")
    assert str(info.value) == expected


@pytest.mark.parametrize("limits", [{"max-foo": 1}, {"max-queues": "x"}, {"max-connections": 1.5}])
def test_vhost_limits(domain, limits):
    expected = rabbitmqctl_reason("set_vhost_limits", "-p", "/", json.dumps(limits))
    with pytest.raises(ValueError) as info:
        domain.set_vhost_limits("/", limits)
    assert str(info.value) == expected
