"""Fixtures for the differential suite: the reference RabbitMQ, and `differ`,
which runs one scenario on hutch and on RabbitMQ and returns both observations.

`vhost_on_both` is a fresh vhost on both brokers, for the tests that
compare management API answers or link the two brokers.

RabbitMQ is found at $DIFFERENTIAL_RABBITMQ_URL, else amqp://guest:guest@127.0.0.1:5672/.
Without one the tests skip, except in CI ($CI set), where they fail.
"""
from __future__ import annotations

import os
import socket

from urllib.parse import urlparse

import pika
import pytest

from helpers import unique
from http_api import Api, call, segment

from .diffkit import run_scenario

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _probe(url: str) -> str | None:
    """None when an AMQP login works at `url`, else why not."""
    params = pika.URLParameters(url)
    try:
        socket.create_connection((params.host, params.port), timeout=3).close()
    except OSError as exc:
        return "cannot connect: %s" % exc
    params.socket_timeout = 5
    params.connection_attempts = 1
    try:
        connection = pika.BlockingConnection(params)
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable"
        return "AMQP connection failed: %r" % exc
    product = connection._impl.server_properties.get("product")
    connection.close()
    if product != "RabbitMQ":
        return "the broker there is %r, not RabbitMQ" % (product,)
    return None


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    url = os.environ.get("DIFFERENTIAL_RABBITMQ_URL") or DEFAULT_URL
    problem = _probe(url)
    if problem is not None:
        reason = "no RabbitMQ reachable at %s (%s); tests/prepare.sh installs and starts one" % (url, problem)
        if _in_ci():
            pytest.fail(reason + " [CI is set, so this is a failure, not a skip]", pytrace=False)
        pytest.skip(reason)
    return url


def rabbitmq_management(rabbitmq_url: str) -> tuple[int, tuple[str, str]]:
    """(port, credentials) of the reference RabbitMQ's management API
    ($DIFFERENTIAL_RABBITMQ_API, else http://127.0.0.1:15672); a skip, or a
    failure in CI, when it does not answer."""
    url = urlparse(os.environ.get("DIFFERENTIAL_RABBITMQ_API") or "http://127.0.0.1:15672")
    credentials = (urlparse(rabbitmq_url).username or "guest", urlparse(rabbitmq_url).password or "guest")
    try:
        status = call(url.port, "GET", "/api/overview", auth=credentials).status
    except OSError as exc:
        status = exc
    if status != 200:
        reason = "no RabbitMQ management API at %s (%s); tests/prepare.sh enables it" % (url.geturl(), status)
        if _in_ci():
            pytest.fail(reason + " [CI is set, so this is a failure, not a skip]", pytrace=False)
        pytest.skip(reason)
    return url.port, credentials


@pytest.fixture
def rabbitmq_api(rabbitmq_url):
    return rabbitmq_management(rabbitmq_url)


@pytest.fixture
def vhost_on_both(api, rabbitmq_api):
    """(hutch Api, RabbitMQ Api, vhost name): a fresh vhost of the same name
    on each broker, where each API's user has every permission, deleted from
    both afterwards."""
    port, credentials = rabbitmq_api
    rabbit = Api(port, credentials)
    name = unique("diff")
    for side in (api, rabbit):
        assert side.put("/api/vhosts/" + segment(name)).status == 201
        assert side.put("/api/permissions/%s/%s" % (segment(name), side.auth[0]),
                        {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    yield api, rabbit, name
    for side in (api, rabbit):
        side.delete("/api/vhosts/" + segment(name))


@pytest.fixture
def differ(rabbitmq_url, broker):
    """differ(scenario, delivery_count=False) -> (hutch observations, RabbitMQ
    observations); `delivery_count` compares x-delivery-count headers too."""

    def run(scenario: list, delivery_count: bool = False) -> tuple[list, list]:
        return (run_scenario(broker.url, scenario, delivery_count),
                run_scenario(rabbitmq_url, scenario, delivery_count))

    return run
