"""What the hutchctl tests run against: a "target" is a broker with a
management HTTP API (hutch's, or RabbitMQ's on this machine), and `run`
starts `python -m cli.hutchctl` as a subprocess aimed at it.

RabbitMQ's API is found at $HUTCHCTL_RABBITMQ_API (default
http://127.0.0.1:15672, guest/guest), its AMQP port at
$DIFFERENTIAL_RABBITMQ_URL like the differential suite; rabbitmqctl on PATH is
the reference for byte-for-byte output. Without them the tests that need them
skip (in CI, where $CI is set, they fail).
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

ROOT = Path(__file__).resolve().parent.parent
RABBITMQ_API = os.environ.get("HUTCHCTL_RABBITMQ_API") or "http://127.0.0.1:15672"
RABBITMQ_AMQP = os.environ.get("DIFFERENTIAL_RABBITMQ_URL") or "amqp://guest:guest@127.0.0.1:5672/"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str):
    if _in_ci():
        pytest.fail(reason + " [CI is set, so this is a failure, not a skip]", pytrace=False)
    pytest.skip(reason)


def api_problem(url: str) -> str | None:
    """None when GET /api/overview works with guest/guest at `url`, else why not."""
    request = urllib.request.Request(url + "/api/overview")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            json.load(response)
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable"
        return "%s/api/overview: %s" % (url, exc)
    return None


def clean_environ(**extra: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    environ.update(extra)
    return environ


def hutchctl(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run hutchctl from this worktree; `env` replaces the HUTCH_* variables."""
    return subprocess.run([sys.executable, "-m", "cli.hutchctl", *args], cwd=ROOT, env=clean_environ(**(env or {})),
                          input=stdin, capture_output=True, text=True, timeout=60)


def rabbitmqctl(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("rabbitmqctl") is None:
        unavailable("rabbitmqctl is not installed (needed as the reference output)")
    return subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=60)


@dataclass
class Target:
    name: str  # "rabbitmq" or "hutch"
    api_url: str
    amqp_url: str  # of the default vhost

    @property
    def is_hutch(self) -> bool:
        return self.name == "hutch"

    def run(self, *args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
        settings = {"HUTCH_URL": self.api_url, "HUTCH_USERNAME": "guest", "HUTCH_PASSWORD": "guest"}
        settings.update(env or {})
        return hutchctl(*args, env=settings, stdin=stdin)

    def ok(self, *args: str) -> str:
        """stdout of a command that must succeed."""
        result = self.run(*args)
        assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
        return result.stdout

    def http(self, method: str, path: str, body=None) -> int:
        """The status of one management API call as guest (set-up and
        clean-up without a hutchctl process each)."""
        request = urllib.request.Request(self.api_url + path, method=method,
                                         data=None if body is None else json.dumps(body).encode())
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    def add_vhost(self, name: str) -> None:
        """Set-up: vhost `name` where guest has every permission, made over
        the API (hutchctl's add_vhost and set_permissions are tested on their
        own; a hutchctl process each would cost a second, rabbitmqctl's two)."""
        path = urllib.parse.quote(name, safe="")
        assert self.http("PUT", "/api/vhosts/" + path, {}) == 201, name
        # the creator may have them already: 201 or 204
        assert self.http("PUT", "/api/permissions/%s/guest" % path,
                         {"configure": ".*", "write": ".*", "read": ".*"}) in (201, 204), name

    def delete_vhost(self, name: str) -> None:
        """Clean-up over the API."""
        self.http("DELETE", "/api/vhosts/" + urllib.parse.quote(name, safe=""))

    def connect(self, vhost: str = "/", username: str = "guest", password: str = "guest"):
        params = pika.URLParameters(self.amqp_url)
        params.virtual_host = vhost
        params.credentials = pika.PlainCredentials(username, password)
        return pika.BlockingConnection(params)


def rabbitmq_target() -> Target:
    problem = api_problem(RABBITMQ_API)
    if problem is not None:
        unavailable("RabbitMQ's management API is not reachable (%s)" % problem)
    return Target("rabbitmq", RABBITMQ_API, RABBITMQ_AMQP)


def hutch_target(broker) -> Target:
    port = broker.ports["HTTP"]  # the session broker waits for its HTTP listener
    return Target("hutch", "http://127.0.0.1:%d" % port, broker.url)
