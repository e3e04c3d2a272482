"""Clients in other languages, as a new user runs them, on hutch and on the
reference RabbitMQ: the rabbitmq-c command-line tools (amqp-tools), and
RabbitMQ's tutorials written with php-amqplib and Ruby's Bunny
(tests/client_scripts). Each prints what it saw; the two brokers must print
the same. tests/prepare.sh installs the Debian packages; without them the tests skip,
except in CI ($CI set), where they fail.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest

from helpers import unique

from .conftest import _in_ci

pytestmark = pytest.mark.differential

SCRIPTS = Path(__file__).resolve().parent.parent / "client_scripts"
PHP_AMQPLIB = Path("/usr/share/php/PhpAmqpLib/autoload.php")


def need(program: str, package: str) -> None:
    if shutil.which(program) is None:
        reason = "%s is not installed (Debian package %s; tests/prepare.sh installs it)" % (program, package)
        if _in_ci():
            pytest.fail(reason + " [CI is set, so this is a failure, not a skip]", pytrace=False)
        pytest.skip(reason)


def run(*argv: str, stdin: str | None = None) -> tuple[int, str]:
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
    return result.returncode, result.stdout + result.stderr


def amqp_tools_session(port: int, queue: str) -> list:
    """amqp-declare-queue, amqp-publish, amqp-get, amqp-consume and
    amqp-delete-queue as their manual pages show them; (status, output) each."""
    url = "--url=amqp://guest:guest@127.0.0.1:%d" % port
    seen = [run("amqp-declare-queue", url, "-q", queue, "-d"),
            run("amqp-publish", url, "-r", queue, "-p", "-C", "text/plain", "-H", "x-n: 1", "-b", "hello"),
            run("amqp-get", url, "-q", queue),
            run("amqp-get", url, "-q", queue)]  # empty: exit status 2
    seen.append(run("amqp-publish", url, "-r", queue, "-l", stdin="one\ntwo\nthree\n"))  # a message a line
    seen.append(run("amqp-consume", url, "-q", queue, "-c", "3", "-p", "1", "cat"))
    seen.append(run("amqp-get", url, "-q", queue + ".missing"))
    seen.append(run("amqp-delete-queue", url, "-q", queue))
    seen.append(run("amqp-publish", "--url=amqp://guest:wrong@127.0.0.1:%d" % port, "-r", queue, "-b", "x"))
    return seen


def test_amqp_tools(broker, rabbitmq_url):
    need("amqp-publish", "amqp-tools")
    queue = unique("rabbitmq-c")
    hutch = amqp_tools_session(broker.port, queue)
    rabbit = amqp_tools_session(urlparse(rabbitmq_url).port or 5672, queue)
    assert hutch == rabbit
    assert hutch[:4] == [(0, queue + "\n"), (0, ""), (0, "hello"), (2, "")]
    assert hutch[5] == (0, "one\ntwo\nthree\n")
    assert hutch[7] == (0, "0\n")  # the messages left in the deleted queue


@pytest.mark.parametrize("language, program, package, script", [
    ("php", "php", "php-cli php-amqplib", "tutorial.php"),
    ("ruby", "ruby", "ruby-bunny", "tutorial.rb"),
])
def test_tutorials(broker, rabbitmq_url, language, program, package, script):
    need(program, package)
    if language == "php" and not PHP_AMQPLIB.exists():
        need("php-amqplib (%s)" % PHP_AMQPLIB, "php-amqplib")
    queue = unique(language)
    hutch = run(program, str(SCRIPTS / script), str(broker.port), queue)
    rabbit = run(program, str(SCRIPTS / script), str(urlparse(rabbitmq_url).port or 5672), queue)
    assert hutch == rabbit
    status, output = hutch
    assert status == 0, output
    assert "consumed: task 0\nconsumed: task 1\nconsumed: task 2\n" in output
    assert "c1" in output and "42" in output and "no queue '%s.missing'" % queue in output
