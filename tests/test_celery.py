"""Celery end to end: a real worker process (one, `--pool solo`, started once
for the module) takes tasks from hutch and sends results back over AMQP with
the `rpc://` backend, as in Celery's first-steps guide. Chains, groups,
retries, a failure that reaches the caller, and a countdown (a message the
worker holds unacked until its time). The tasks live in tests/celery_app.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from celery import chain, group

from helpers import unique, wait_for
from http_api import Api, segment

TESTS = Path(__file__).resolve().parent
# The first task also waits for the worker to connect and start consuming.
FIRST_RESULT = 45.0  # within the suite's 60 s per test, so the worker's log is shown
RESULT = 30.0


@pytest.fixture(scope="module")
def celery(broker, tmp_path_factory):
    """(the Celery app, the worker's process, the API, the vhost, the task
    queue): a worker consuming from a fresh vhost of the session broker."""
    api, vhost, queue = Api(broker.ports["HTTP"]), unique("celery"), unique("tasks")
    assert api.put("/api/vhosts/" + segment(vhost)).status == 201
    url = "amqp://guest:guest@127.0.0.1:%d/%s" % (broker.port, segment(vhost))
    environ = {**os.environ, "CELERY_TEST_BROKER": url, "CELERY_TEST_QUEUE": queue,
               "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path_factory.mktemp("celery") / "worker.log"
    with log.open("w") as stderr:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool", "solo", "--concurrency", "1",
             "--without-heartbeat", "--without-mingle", "--without-gossip", "--loglevel", "warning"],
            cwd=TESTS, env=environ, stdout=subprocess.DEVNULL, stderr=stderr)
    worker.log = log
    import celery_app  # this process sends the tasks and reads the results
    celery_app.app.conf.update(broker_url=url, task_default_queue=queue)
    try:
        yield celery_app, worker, api, vhost, queue
    finally:
        # Every task is done and the vhost goes next: a kill loses nothing. (Celery's
        # warm or cold shutdown waits for the solo pool's event loop to wake, 10 s.)
        worker.kill()
        worker.wait()
        celery_app.app.close()
        api.delete("/api/vhosts/" + segment(vhost))


def test_a_task_runs_on_the_worker_and_its_result_comes_back(celery):
    tasks, worker, api, vhost, queue = celery
    result = tasks.add.delay(2, 3)
    try:
        assert result.get(timeout=FIRST_RESULT) == 5
    except Exception:
        raise AssertionError("no result; the worker said:\n" + worker.log.read_text()) from None
    assert result.successful() and result.state == "SUCCESS"
    # the task queue is the one Celery declared on hutch, and it is drained
    wait_for(lambda: api.get("/api/queues/%s/%s" % (segment(vhost), queue)).body.get("messages") == 0,
             timeout=RESULT)


def test_a_chain_passes_each_result_on(celery):
    tasks = celery[0]
    assert chain(tasks.add.s(1, 2), tasks.mul.s(10), tasks.add.s(5)).apply_async().get(timeout=RESULT) == 35


def test_a_group_collects_every_result_in_order(celery):
    tasks = celery[0]
    assert group(tasks.mul.s(i, i) for i in range(8)).apply_async().get(timeout=RESULT) == [i * i for i in range(8)]


def test_a_retried_task_succeeds_on_a_later_attempt(celery):
    tasks = celery[0]
    assert tasks.succeed_on_attempt.delay(3).get(timeout=RESULT) == 2  # two retries, then success


def test_a_task_out_of_retries_raises_its_error_in_the_caller(celery):
    tasks = celery[0]
    result = tasks.always_fails.delay()
    with pytest.raises(LookupError, match="still failing"):
        result.get(timeout=RESULT)
    assert result.state == "FAILURE"


def test_a_countdown_task_waits_while_others_run(celery):
    """The worker holds the countdown task's message unacked until its time
    and runs the task sent after it meanwhile."""
    tasks = celery[0]
    later = tasks.add.apply_async((1, 1), countdown=2)
    now = tasks.add.delay(2, 2)
    assert now.get(timeout=RESULT) == 4
    assert later.get(timeout=RESULT) == 2
    assert now.date_done < later.date_done
