"""Tests that need a service say so: with $CI set (.ci/run sets it), a test
whose browser or reference RabbitMQ is missing fails, naming what is missing;
without $CI it is skipped. Each case runs pytest on one such test in a child
process (one process: -n 0), with the service made unreachable."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT

CLOSED = "127.0.0.1:1"  # nothing listens on port 1
CASES = {
    "browser": ("tests/test_ui.py::test_every_page_opens_without_an_error", {"PATH": "/nonexistent"},
                "chromium"),
    "rabbitmq": ("tests/differential/test_diff_permissions.py::test_configure_permission",
                 {"DIFFERENTIAL_RABBITMQ_URL": "amqp://guest:guest@%s/" % CLOSED}, "no RabbitMQ reachable"),
    "rabbitmq management": ("tests/differential/test_links_interop.py::test_shovel_hutch_to_rabbitmq",
                            {"DIFFERENTIAL_RABBITMQ_API": "http://" + CLOSED}, "no RabbitMQ management API"),
    "rabbitmq stream plugin": ("tests/differential/test_diff_stream_protocol.py::test_same_as_rabbitmq[raw_codes]",
                               {"DIFFERENTIAL_RABBITMQ_STREAM_PORT": "1"}, "RabbitMQ's stream plugin"),
    "partition harness": ("tests/test_cluster_partitions.py::test_partitions_of_the_leader_lose_nothing_and_heal",
                          {"PATH": "/nonexistent"}, "missing ip, nft, unshare, etcd"),
    "node": ("tests/test_stream_protocol.py::test_javascript_stream_client", {"PATH": "/nonexistent"},
             "node or tests/client_scripts/node_modules missing"),
}


def run_pytest(test: str, env: dict, ci: bool) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "CI"}
    environ.update(env)
    if ci:
        environ["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rs", test],
                          cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_missing_service_fails_in_ci_and_skips_elsewhere(case):
    test, env, what = CASES[case]
    in_ci = run_pytest(test, env, ci=True)
    assert in_ci.returncode == 1, in_ci.stdout + in_ci.stderr
    assert "CI is set, so this is a failure, not a skip" in in_ci.stdout and what in in_ci.stdout, in_ci.stdout
    assert "skipped" not in in_ci.stdout  # (a parametrized test runs more than once)
    elsewhere = run_pytest(test, env, ci=False)
    assert elsewhere.returncode == 0 and " skipped" in elsewhere.stdout and what in elsewhere.stdout, \
        elsewhere.stdout
