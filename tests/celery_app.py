"""The Celery application of tests/test_celery.py, imported by the test (to
send tasks and read results) and by the real worker process it starts.

The broker URL and the task queue come from the environment, so the worker
and the test agree on them; results travel back over AMQP (`rpc://`: a reply
queue per client, correlation ids), as in Celery's first-steps guide.
"""
from __future__ import annotations

import os

from celery import Celery

app = Celery("celery_app", broker=os.environ.get("CELERY_TEST_BROKER", "amqp://guest:guest@127.0.0.1//"),
             backend="rpc://")
app.conf.update(
    task_default_queue=os.environ.get("CELERY_TEST_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    result_expires=None,
)


@app.task
def add(x, y):
    return x + y


@app.task
def mul(x, y):
    return x * y


@app.task(bind=True, max_retries=3, default_retry_delay=0.05)
def succeed_on_attempt(self, attempt):
    """Fails (and is retried by Celery) until its `attempt`-th run."""
    if self.request.retries + 1 < attempt:
        raise self.retry(exc=ValueError("attempt %d" % (self.request.retries + 1)))
    return self.request.retries


@app.task(bind=True, max_retries=1, default_retry_delay=0.05)
def always_fails(self):
    raise self.retry(exc=LookupError("still failing"))
