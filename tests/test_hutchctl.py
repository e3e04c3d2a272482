"""hutchctl as a subprocess against a broker's management API: its output,
exit statuses and effects, checked from the outside (AMQP clients, the
listings, and rabbitmqctl as the reference for the output format).

Every test runs against each target (hutchctl_targets.py): RabbitMQ now, and
hutch once its management API is wired into the `broker` fixture. Tests of
hutch's own API extensions (peek, move, the memory watermark) skip against
RabbitMQ. State lives in a fresh vhost per test, so the shared brokers are
only touched there (and by uniquely named users).
"""
from __future__ import annotations

import json
import shlex

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAccessDeniedError, \
    ProbableAuthenticationError

from helpers import unique, wait_for
from hutchctl_targets import RABBITMQ_AMQP, ROOT, hutch_target, rabbitmq_target, rabbitmqctl

# the management API publishes statistics (message counts, connections) every few seconds
STATS = 30.0
# rabbitmqctl takes a second or two per call, and statistics are waited for
pytestmark = pytest.mark.timeout(180)


# What hutch's broker or management API does not do yet, by test (and list_queues case). These
# tests are expected to fail against hutch, strictly: once the feature lands they report XPASS,
# and the entry goes.
HUTCH_GAPS: dict = {}


@pytest.fixture(params=["rabbitmq", "hutch"])
def target(request):
    if request.param == "rabbitmq":
        request.applymarker(pytest.mark.differential)
        return rabbitmq_target()
    case = getattr(request.node, "callspec", None) and request.node.callspec.params.get("case")
    gap = HUTCH_GAPS.get((request.node.originalname, case))
    if gap is not None:
        request.applymarker(pytest.mark.xfail(reason=gap, strict=True))
    return hutch_target(request.getfixturevalue("broker"))


@pytest.fixture
def hutch_only(target):
    """Skips (before any vhost is made) unless the target is hutch."""
    if not target.is_hutch:
        pytest.skip("a hutch extension of the management API; RabbitMQ has no such endpoint")
    return target


@pytest.fixture
def vhost(target):
    """A fresh vhost on the target where guest has full permissions."""
    name = unique("hutchctl")
    target.add_vhost(name)
    yield name
    target.delete_vhost(name)


@pytest.fixture
def reference_vhost():
    """make(name) creates vhost `name` on RabbitMQ (for rabbitmqctl's output) and
    returns an AMQP connection to it; everything made is deleted afterwards."""
    made = []

    def make(name: str):
        rabbitmq_target().add_vhost(name)
        made.append(name)
        params = pika.URLParameters(RABBITMQ_AMQP)
        params.virtual_host = name
        return pika.BlockingConnection(params)

    yield make
    for name in made:
        rabbitmq_target().delete_vhost(name)


def rows_of_json(text: str) -> list[dict]:
    return json.loads(text)


# -- list_queues: byte for byte what rabbitmqctl prints on the same state -------------------

QUEUE_STATES = {
    # one queue: rabbitmqctl's row order is its table order, so one row compares exactly
    "one queue": [("orders", {}, 3)],
    "tab and space in the name": [("q 2\ttab", {}, 1)],
    # declared in key order: RabbitMQ's API sorts arguments by key (see docs/cli.md)
    "arguments": [("limited", {"x-dead-letter-exchange": "dlx", "x-max-length": 10, "x-queue-mode": "lazy"}, 2)],
    "empty vhost": [],
}
ITEMS = ["name", "durable", "auto_delete", "exclusive", "messages_ready", "messages_unacknowledged", "consumers",
         "policy", "arguments"]
LIST_QUEUES_CASES = {
    **{state: (state, []) for state in QUEUE_STATES},
    "-q": ("one queue", ["-q"]),
    "-s": ("one queue", ["-s"]),
    "--no-table-headers": ("one queue", ["--no-table-headers"]),
    "json": ("tab and space in the name", ["--formatter", "json"]),
    "csv": ("tab and space in the name", ["--formatter", "csv"]),
    "items": ("arguments", ITEMS),
    "items json": ("arguments", [*ITEMS, "--formatter", "json"]),
    "items csv": ("arguments", [*ITEMS, "--formatter", "csv"]),
    "json empty": ("empty vhost", ["--formatter", "json"]),
}


def build(connection, queues) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    for name, arguments, count in queues:
        channel.queue_declare(name, durable=True, arguments=arguments)
        for i in range(count):
            channel.basic_publish("", name, b"m%d" % i)


@pytest.mark.parametrize("case", sorted(LIST_QUEUES_CASES))
def test_list_queues_prints_what_rabbitmqctl_prints(target, reference_vhost, case):
    state, extra = LIST_QUEUES_CASES[case]
    name = unique("lq")
    reference = reference_vhost(name)
    build(reference, QUEUE_STATES[state])
    reference.close()
    if target.is_hutch:
        target.add_vhost(name)
        connection = target.connect(name)
        build(connection, QUEUE_STATES[state])
        connection.close()
    args = ["list_queues", "-p", name, *extra]
    expected = rabbitmqctl(*args)
    assert expected.returncode == 0, expected.stderr
    try:
        # message counts reach the API with the next statistics emission
        wait_for(lambda: target.run(*args).stdout == expected.stdout, timeout=STATS, interval=0.5)
    except AssertionError:
        pass
    result = target.run(*args)
    assert (result.returncode, result.stdout, result.stderr) == (0, expected.stdout, "")
    if target.is_hutch:
        target.delete_vhost(name)


def test_list_queues_shows_hutchs_message_states(hutch_only, target, vhost):
    connection, channel = fill(target, vhost, "states", 4)
    channel.queue_declare("transient")
    channel.basic_publish("", "transient", b"in ram")
    connection.close()
    rows = rows_of_json(target.ok("list_queues", "-p", vhost, "name", "messages", "messages_alpha",
                                  "messages_gamma", "messages_delta", "messages_paged_out", "--formatter", "json"))
    by_name = {row["name"]: row for row in rows}
    states = by_name["states"]
    assert states["messages_alpha"] + states["messages_gamma"] + states["messages_delta"] == 4
    assert states["messages_delta"] == states["messages_paged_out"]
    assert by_name["transient"]["messages_alpha"] == 1  # a transient message lives in RAM only


def test_list_queues_with_many_queues_has_rabbitmqctls_lines(target, reference_vhost):
    # rabbitmqctl's row order is that of its internal table; the rows themselves must match
    name = unique("lqm")
    state = [("a-%d" % i, {}, i) for i in range(5)]
    reference = reference_vhost(name)
    build(reference, state)
    reference.close()
    if target.is_hutch:
        target.add_vhost(name)
        connection = target.connect(name)
        build(connection, state)
        connection.close()
    expected = rabbitmqctl("list_queues", "-p", name, "name", "messages", "durable").stdout.splitlines()

    def lines():
        out = target.ok("list_queues", "-p", name, "name", "messages", "durable").splitlines()
        return out[:3] + sorted(out[3:])

    want = expected[:3] + sorted(expected[3:])
    try:
        wait_for(lambda: lines() == want, timeout=STATS, interval=0.5)
    except AssertionError:
        pass
    assert lines() == want
    if target.is_hutch:
        target.delete_vhost(name)


# -- the other listings, against rabbitmqctl on the same state ------------------------------

def test_vhost_listings_match_rabbitmqctl(target, reference_vhost):
    name = unique("ls")

    def populate(connection, policy_runner):
        channel = connection.channel()
        channel.exchange_declare("events", "topic", durable=True)
        channel.exchange_declare("side", "fanout", auto_delete=True, arguments={"alternate-exchange": "events"})
        channel.queue_declare("audit", durable=True)
        channel.queue_bind("audit", "events", "order.#", arguments={"x-match-extra": 1})
        channel.exchange_bind("side", "events", "a.*")
        connection.close()
        policy_runner("set_policy", "-p", name, "--priority", "2", "--apply-to", "queues", "cap", "^audit$",
                      '{"max-length": 100, "overflow": "reject-publish"}')

    populate(reference_vhost(name), rabbitmqctl)
    if target.is_hutch:
        target.add_vhost(name)
        populate(target.connect(name), target.ok)
    for command in (["list_exchanges"], ["list_exchanges", "name", "type", "durable", "auto_delete", "internal",
                                         "arguments"],
                    ["list_bindings"], ["list_bindings", "--formatter", "json"], ["list_permissions"],
                    ["list_policies"], ["list_policies", "--formatter", "csv"], ["list_topic_permissions"],
                    ["list_consumers"]):
        args = [*command, "-p", name]
        expected, result = rabbitmqctl(*args), target.run(*args)
        assert result.returncode == expected.returncode == 0, (command, result.stderr)
        if "json" in command:
            assert sorted(rows_of_json(result.stdout), key=json.dumps) == \
                sorted(rows_of_json(expected.stdout), key=json.dumps), command
        else:
            want, got = expected.stdout.splitlines(), result.stdout.splitlines()
            head = 1 if "csv" in command else 2  # banner, header row
            assert got[:head] == want[:head], command
            assert sorted(got[head:]) == sorted(want[head:]), command
    if target.is_hutch:
        target.delete_vhost(name)


def test_list_policies_and_permissions_when_empty_print_an_empty_line_or_brackets(target, vhost):
    target.ok("clear_permissions", "-p", vhost, "guest")
    assert target.ok("list_permissions", "-p", vhost) == 'Listing permissions for vhost "%s" ...\n\n' % vhost
    assert target.ok("list_policies", "-p", vhost, "--formatter", "json") == "[]\n"
    assert target.ok("list_queues", "-p", vhost, "--formatter", "json") == "[\n]\n"
    assert target.ok("list_queues", "-p", vhost, "-q") == ""


def test_list_vhosts_shows_description_tags_and_tracing(target):
    name = unique("lv")
    target.ok("add_vhost", name, "--description", "for tests", "--tags", "qa,blue")
    try:
        vhosts = rows_of_json(target.ok("list_vhosts", "name", "description", "tags", "tracing", "--formatter", "json"))
        assert {"name": name, "description": "for tests", "tags": ["qa", "blue"], "tracing": False} in vhosts
        assert "%s\tfor tests\t[qa, blue]\tfalse" % name in target.ok("list_vhosts", "name", "description",
                                                                      "tags", "tracing").splitlines()
        target.ok("trace_on", "-p", name)  # sends description and tags back: the PUT replaces them
        assert "%s\tfor tests\t[qa, blue]\ttrue" % name in target.ok("list_vhosts", "name", "description",
                                                                     "tags", "tracing").splitlines()
        target.ok("trace_off", "-p", name)
    finally:
        target.delete_vhost(name)


def test_list_users_shows_tags(target):
    user = unique("lu")
    target.ok("add_user", user, "pw")
    try:
        assert "%s\t[]" % user in target.ok("list_users").splitlines()
        target.ok("set_user_tags", user, "management", "policymaker")
        assert "%s\t[management, policymaker]" % user in target.ok("list_users").splitlines()
        assert {"user": user, "tags": ["management", "policymaker"]} in rows_of_json(
            target.ok("list_users", "--formatter", "json"))
    finally:
        target.run("delete_user", user)


def test_list_user_permissions_of_an_unknown_user_fails(target):
    user = unique("ghost")
    result = target.run("list_user_permissions", user)
    assert (result.returncode, result.stderr) == (69, 'Error:\nUser "%s" does not exist\n' % user)


def test_connections_channels_and_consumers_are_listed_and_a_connection_can_be_closed(target, vhost):
    connection_name = unique("conn")
    params = pika.URLParameters(target.amqp_url)
    params.virtual_host = vhost
    params.client_properties = {"connection_name": connection_name}
    connection = pika.BlockingConnection(params)
    channel = connection.channel()
    channel.queue_declare("work")
    channel.basic_qos(prefetch_count=7)
    channel.basic_consume("work", lambda *a: None, consumer_tag="ctag-1", arguments={"x-priority": 5})

    def mine():
        rows = rows_of_json(target.ok("list_connections", "name", "vhost", "user", "client_properties",
                                      "--formatter", "json"))
        return [row for row in rows if row["vhost"] == vhost]

    rows = wait_for(mine, timeout=STATS, interval=0.5)
    assert rows[0]["user"] == "guest"
    assert ["connection_name", "longstr", connection_name] in rows[0]["client_properties"]
    name = rows[0]["name"]
    # RabbitMQ fills in a consumer's channel details with the channel's next statistics
    consumers = wait_for(lambda: [row for row in rows_of_json(target.ok("list_consumers", "-p", vhost,
                                                                        "--formatter", "json"))
                                  if row["channel_pid"]], timeout=STATS, interval=0.5)
    assert len(consumers) == 1
    assert consumers[0]["queue_name"] == "work"
    assert consumers[0]["consumer_tag"] == "ctag-1"
    assert consumers[0]["ack_required"] is True
    assert consumers[0]["prefetch_count"] == 7
    assert consumers[0]["arguments"] == [["x-priority", "signedint", 5]]
    assert wait_for(lambda: [row for row in rows_of_json(target.ok("list_channels", "connection", "prefetch_count",
                                                                   "consumer_count", "--formatter", "json"))
                             if row["connection"] == name and row["consumer_count"] == 1],
                    timeout=STATS, interval=0.5)[0]["prefetch_count"] == 7

    out = target.ok("close_connection", name, "maintenance window")
    assert out == "Closing connection %s, reason: maintenance window...\n" % name
    with pytest.raises(ConnectionClosedByBroker) as closed:
        wait_for(lambda: connection.process_data_events(time_limit=0.1), timeout=10)
    assert closed.value.reply_code == 320
    assert "maintenance window" in closed.value.reply_text


def test_close_connection_of_an_unknown_connection_fails(target):
    result = target.run("close_connection", "no such connection", "bye")
    assert result.returncode == 69
    assert "no such connection" in result.stderr


# -- users, permissions, vhosts ---------------------------------------------------------------

def amqp_login(target, vhost, user, password):
    """'ok', 'auth' (bad credentials) or 'access' (no access to the vhost)."""
    try:
        target.connect(vhost, user, password).close()
    except ProbableAuthenticationError:
        return "auth"
    except (ProbableAccessDeniedError, ConnectionClosedByBroker):
        return "access"
    return "ok"


def test_user_lifecycle_is_observable_by_logging_in(target, vhost):
    user = unique("user")
    out = target.ok("add_user", user, "first")
    assert out == ('Adding user "%s" ...\nDone. Don\'t forget to grant the user permissions to some virtual hosts! '
                   "See 'hutchctl help set_permissions' to learn more.\n" % user)
    try:
        assert amqp_login(target, vhost, user, "first") == "access"
        assert target.ok("set_permissions", "-p", vhost, user, "^$", ".*", ".*") == \
            'Setting permissions for user "%s" in vhost "%s" ...\n' % (user, vhost)
        assert amqp_login(target, vhost, user, "first") == "ok"
        assert "%s\t^$\t.*\t.*" % user in target.ok("list_permissions", "-p", vhost).splitlines()
        assert "%s\t^$\t.*\t.*" % vhost in target.ok("list_user_permissions", user).splitlines()

        target.ok("change_password", user, "second")
        assert amqp_login(target, vhost, user, "first") == "auth"
        assert amqp_login(target, vhost, user, "second") == "ok"

        target.ok("set_user_tags", user, "monitoring")  # keeps the password
        assert amqp_login(target, vhost, user, "second") == "ok"

        assert target.ok("clear_permissions", "-p", vhost, user) == \
            'Clearing permissions for user "%s" in vhost "%s" ...\n' % (user, vhost)
        assert amqp_login(target, vhost, user, "second") == "access"

        again = target.run("add_user", user, "third")
        assert (again.returncode, again.stderr) == (70, 'Error:\nUser "%s" already exists\n' % user)
    finally:
        target.ok("delete_user", user)
    assert amqp_login(target, vhost, user, "second") == "auth"
    gone = target.run("delete_user", user)
    assert (gone.returncode, gone.stdout, gone.stderr) == \
        (67, 'Deleting user "%s" ...\n' % user, 'Error:\nUser "%s" does not exist\n' % user)


def test_add_user_reads_the_password_from_stdin_when_not_given(target, vhost):
    user = unique("stdin")
    result = target.run("add_user", user, stdin="from-stdin\n")
    assert result.returncode == 0, result.stderr
    try:
        target.ok("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        assert amqp_login(target, vhost, user, "from-stdin") == "ok"
    finally:
        target.run("delete_user", user)


@pytest.mark.parametrize("args, code, stderr", [
    (["change_password", "{user}", "x"], 67, 'Error:\nUser "{user}" does not exist\n'),
    (["set_user_tags", "{user}", "a"], 67, 'Error:\nUser "{user}" does not exist\n'),
    (["set_permissions", "-p", "{vhost}", "{user}", "a", "b", "c"], 67, "Error:\nUser {user} does not exist\n"),
    (["clear_permissions", "-p", "{vhost}", "{user}"], 67, "Error:\nUser {user} does not exist\n"),
    (["set_permissions", "-p", "{vhost}-nope", "guest", "a", "b", "c"], 69,
     "Error:\nVirtual host {vhost}-nope does not exist\n"),
    (["delete_vhost", "{vhost}-nope"], 65, "Virtual host '{vhost}-nope' does not exist\n"),
])
def test_missing_users_and_vhosts_get_rabbitmqctls_message_and_status(target, vhost, args, code, stderr):
    names = {"user": unique("nobody"), "vhost": vhost}
    result = target.run(*[a.format(**names) for a in args])
    assert (result.returncode, result.stderr) == (code, stderr.format(**names))


def test_add_and_delete_vhost(target):
    name = unique("vh")
    assert target.ok("add_vhost", name) == 'Adding vhost "%s" ...\n' % name
    assert name in target.ok("list_vhosts", "-s").splitlines()
    assert target.ok("delete_vhost", name) == 'Deleting vhost "%s" ...\n' % name
    assert name not in target.ok("list_vhosts", "-s").splitlines()


def test_topic_permissions_are_set_listed_and_cleared(target, vhost):
    user = unique("topic")
    target.ok("add_user", user, "pw")
    try:
        assert target.ok("set_topic_permissions", "-p", vhost, user, "amq.topic", "^orders\\.", "^x") == \
            'Setting topic permissions on "amq.topic" for user "%s" in vhost "%s" ...\n' % (user, vhost)
        assert target.ok("list_topic_permissions", "-p", vhost, "-s") == "%s\tamq.topic\t^orders\\.\t^x\n" % user
        target.ok("clear_topic_permissions", "-p", vhost, user)
        assert target.ok("list_topic_permissions", "-p", vhost, "-q") == "\n"
    finally:
        target.run("delete_user", user)


# -- policies -----------------------------------------------------------------------------------

def test_policies_are_set_listed_applied_and_cleared(target, vhost):
    out = target.ok("set_policy", "-p", vhost, "--apply-to", "queues", "--priority", "4", "short", "^short\\.",
                    '{"max-length": 2}')
    assert out == ('Setting policy "short" for pattern "^short\\." to "{"max-length": 2}" with priority "4" '
                   'for vhost "%s" ...\n' % vhost)
    assert target.ok("list_policies", "-p", vhost, "-s") == \
        '%s\tshort\t^short\\.\tqueues\t{"max-length":2}\t4\n' % vhost
    connection = target.connect(vhost)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("short.q")
    for i in range(5):
        channel.basic_publish("", "short.q", b"%d" % i)
    assert channel.queue_declare("short.q", passive=True).method.message_count == 2  # the policy applies
    connection.close()
    assert target.ok("clear_policy", "-p", vhost, "short") == 'Clearing policy "short" on vhost "%s" ...\n' % vhost
    again = target.run("clear_policy", "-p", vhost, "short")
    assert (again.returncode, again.stderr) == (69, "Error:\nParameter does not exist\n")


def test_set_policy_reports_bad_json_and_invalid_definitions(target, vhost):
    bad_json = target.run("set_policy", "-p", vhost, "p", ".*", "{max-length")
    assert (bad_json.returncode, bad_json.stderr) == (69, "Error:\nJSON decoding error. Reason: badarg\n")
    invalid = target.run("set_policy", "-p", vhost, "p", ".*", '{"max-length": "many"}')
    assert invalid.returncode == 69
    assert invalid.stderr.startswith("Error:\nValidation failed")
    assert "is not a valid maximum length" in invalid.stderr
    assert target.ok("list_policies", "-p", vhost, "-q") == "\n"


def test_operator_policies_cap_policies_and_arguments(target, vhost):
    """The smaller of argument, policy and operator policy wins (RabbitMQ's
    precedence): an operator policy cannot raise a limit, only lower it."""
    target.ok("set_policy", "-p", vhost, "--apply-to", "queues", "p", "^cap", '{"max-length": 5}')
    out = target.ok("set_operator_policy", "-p", vhost, "--apply-to", "queues", "op", "^cap", '{"max-length": 3}')
    assert out == ('Setting operator policy override "op" for pattern "^cap" to "{"max-length": 3}" '
                   'with priority "0" for vhost "%s" ...\n' % vhost)
    assert target.ok("list_operator_policies", "-p", vhost, "-s") == \
        '%s\top\t^cap\tqueues\t{"max-length":3}\t0\n' % vhost
    connection = target.connect(vhost)
    channel = connection.channel()
    channel.confirm_delivery()
    for queue, arguments in (("cap.a", {}), ("cap.b", {"x-max-length": 2})):
        channel.queue_declare(queue, arguments=arguments)
        for i in range(6):
            channel.basic_publish("", queue, b"%d" % i)
    assert channel.queue_declare("cap.a", passive=True).method.message_count == 3  # the operator policy's
    assert channel.queue_declare("cap.b", passive=True).method.message_count == 2  # the argument's
    target.ok("set_operator_policy", "-p", vhost, "op", "^cap", '{"max-length": 50}')
    for i in range(6):
        channel.basic_publish("", "cap.a", b"%d" % i)
    assert channel.queue_declare("cap.a", passive=True).method.message_count == 5  # the policy's now
    connection.close()
    assert target.ok("clear_operator_policy", "-p", vhost, "op") == \
        'Clearing operator policy "op" on vhost "%s" ...\n' % vhost
    again = target.run("clear_operator_policy", "-p", vhost, "op")
    assert (again.returncode, again.stderr) == (69, "Error:\nParameter does not exist\n")
    invalid = target.run("set_operator_policy", "-p", vhost, "op", ".*", '{"overflow": "reject-publish"}')
    assert (invalid.returncode, invalid.stderr) == (
        69, 'Error:\nValidation failed\n\n[{<<"overflow">>,<<"reject-publish">>}] are not recognised policy '
            'settings\n')


def test_runtime_and_global_parameters(target, vhost):
    value = '{"uri": "amqp://upstream.example", "max-hops": 2}'
    out = target.ok("set_parameter", "-p", vhost, "federation-upstream", "up", value)
    assert out == ('Setting runtime parameter "up" for component "federation-upstream" to "%s" in vhost "%s" ...\n'
                   % (value, vhost))
    assert target.ok("list_parameters", "-p", vhost, "-s") == \
        'federation-upstream\tup\t{"max-hops":2,"uri":"amqp://upstream.example"}\n'
    invalid = target.run("set_parameter", "-p", vhost, "shovel", "s", '{"src-uri": "amqp://"}')
    assert (invalid.returncode, invalid.stderr) == (
        69, "Error:\nValidation failed\n\nMust specify 'src-exchange' or 'src-queue'\n"
            'Key "dest-uri" not found in s\n')
    bad_json = target.run("set_parameter", "-p", vhost, "shovel", "s", "notjson")
    assert (bad_json.returncode, bad_json.stderr) == (69, "Error:\nJSON decoding error. Reason: badarg\n")
    assert target.ok("clear_parameter", "-p", vhost, "federation-upstream", "up") == \
        'Clearing runtime parameter "up" for component "federation-upstream" on vhost "%s" ...\n' % vhost
    again = target.run("clear_parameter", "-p", vhost, "federation-upstream", "up")
    assert (again.returncode, again.stderr) == (69, "Error:\nParameter does not exist\n")
    assert target.ok("list_parameters", "-p", vhost, "-q") == "\n"
    name = unique("global")
    assert target.ok("set_global_parameter", name, '{"b": 1, "a": [true]}') == \
        'Setting global runtime parameter "%s" to "{"b": 1, "a": [true]}" ...\n' % name
    listed = target.ok("list_global_parameters", "-s").splitlines()
    assert '%s\t{"a":[true],"b":1}' % name in listed
    assert any(line.startswith("internal_cluster_id\t") for line in listed)
    assert target.ok("clear_global_parameter", name) == 'Clearing global runtime parameter "%s" ...\n' % name


# -- queues -------------------------------------------------------------------------------------

def fill(target, vhost, queue, count):
    connection = target.connect(vhost)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for i in range(count):
        channel.basic_publish("", queue, b"body-%d" % i, pika.BasicProperties(delivery_mode=2))
    return connection, channel


def test_purge_queue_empties_it(target, vhost):
    connection, channel = fill(target, vhost, "p", 4)
    assert target.ok("purge_queue", "-p", vhost, "p") == "Purging queue 'p' in vhost '%s' ...\n" % vhost
    assert channel.queue_declare("p", passive=True).method.message_count == 0
    connection.close()
    missing = target.run("purge_queue", "-p", vhost, "nope")
    assert (missing.returncode, missing.stderr) == (69, "Error:\nnot_found\n")


def test_delete_queue_reports_ready_messages_and_honours_if_empty(target, vhost):
    connection, channel = fill(target, vhost, "d", 3)
    kept = target.run("delete_queue", "-p", vhost, "d", "--if-empty")
    assert kept.returncode != 0
    assert kept.stdout == "Deleting queue 'd' on vhost '%s' if queue is empty ...\n" % vhost
    assert channel.queue_declare("d", passive=True).method.message_count == 3
    connection.close()
    wait_for(lambda: "d\t3" in target.ok("list_queues", "-p", vhost, "-s"), timeout=STATS, interval=0.5)
    assert target.ok("delete_queue", "-p", vhost, "d") == \
        "Deleting queue 'd' on vhost '%s' ...\nQueue was successfully deleted with 3 ready messages\n" % vhost
    check = target.connect(vhost).channel()
    with pytest.raises(ChannelClosedByBroker) as closed:
        check.queue_declare("d", passive=True)
    assert closed.value.reply_code == 404
    missing = target.run("delete_queue", "-p", vhost, "d")
    assert (missing.returncode, missing.stderr) == (64, "Error:\nQueue not found\n")


def test_delete_queue_short_u_is_if_unused_after_the_command(target, vhost):
    connection, channel = fill(target, vhost, "u", 0)
    channel.basic_consume("u", lambda *a: None)
    wait_for(lambda: "u\t1" in target.ok("list_queues", "-p", vhost, "-s", "name", "consumers"),
             timeout=STATS, interval=0.5)
    result = target.run("delete_queue", "-p", vhost, "u", "-u")
    assert result.returncode != 0
    assert result.stdout == "Deleting queue 'u' on vhost '%s' if queue is unused ...\n" % vhost
    connection.close()


def test_peek_shows_messages_without_taking_them(hutch_only, target, vhost):
    connection, channel = fill(target, vhost, "pk", 3)
    rows = rows_of_json(target.ok("peek", "-p", vhost, "pk", "--count", "2", "--formatter", "json"))
    assert [row["payload"] for row in rows] == ["body-0", "body-1"]
    assert rows[0]["routing_key"] == "pk"
    assert rows[0]["redelivered"] is False
    assert channel.queue_declare("pk", passive=True).method.message_count == 3
    out = target.ok("peek", "-p", vhost, "pk", "-s").splitlines()
    assert out[0].split("\t")[:4] == ["", "pk", "false", "6"]
    connection.close()


def test_move_to_a_queue_and_to_an_exchange(hutch_only, target, vhost):
    connection, channel = fill(target, vhost, "src", 5)
    channel.queue_declare("dst", durable=True)
    channel.exchange_declare("router", "direct")
    channel.queue_declare("routed")
    channel.queue_bind("routed", "router", "k")
    out = target.ok("move", "-p", vhost, "src", "--to-queue", "dst", "--count", "2")
    assert out == "Moving 2 messages from queue 'src' to queue 'dst' in vhost '%s' ...\nMoved 2 messages\n" % vhost
    assert channel.queue_declare("dst", passive=True).method.message_count == 2
    target.ok("move", "-p", vhost, "src", "--to-exchange", "router", "--routing-key", "k")
    assert channel.queue_declare("src", passive=True).method.message_count == 0
    assert channel.queue_declare("routed", passive=True).method.message_count == 3
    assert channel.basic_get("dst", auto_ack=True)[2] == b"body-0"
    assert channel.basic_get("routed", auto_ack=True)[2] == b"body-2"
    connection.close()


def test_peek_and_move_against_a_broker_without_the_extension_say_so(target, vhost):
    if target.is_hutch:
        pytest.skip("hutch has the extension")
    fill(target, vhost, "q", 1)[0].close()
    for args in (["peek", "-p", vhost, "q"], ["move", "-p", vhost, "q", "--to-queue", "x"]):
        result = target.run(*args)
        assert result.returncode == 69
        assert "hutch extension" in result.stderr


# -- definitions, tracing, node -----------------------------------------------------------------

def test_export_then_import_definitions(target, vhost, tmp_path):
    connection = target.connect(vhost)
    connection.channel().queue_declare("exported", durable=True)
    connection.close()
    exported = json.loads(target.ok("export_definitions", "-"))
    assert {"name": "exported", "vhost": vhost} in [{"name": q["name"], "vhost": q["vhost"]}
                                                   for q in exported["queues"]]
    path = tmp_path / "defs.json"
    assert target.ok("export_definitions", str(path)) == \
        'Exporting definitions in JSON to a file at "%s" ...\n' % path
    assert json.loads(path.read_text())["queues"]
    imported = {"queues": [{"name": "imported", "vhost": vhost, "durable": True, "auto_delete": False,
                            "arguments": {}}]}
    path.write_text(json.dumps(imported))
    assert target.ok("import_definitions", str(path)) == (
        'Importing definitions in JSON from a file at "%s" ...\nSuccessfully started definition import. '
        "This process is asynchronous and can take some time.\n" % path)
    channel = target.connect(vhost).channel()
    assert channel.queue_declare("imported", passive=True).method.message_count == 0
    missing = target.run("import_definitions", str(tmp_path / "nope.json"))
    assert missing.returncode == 65
    assert "Bad argument: File %s does not exist" % (tmp_path / "nope.json") in missing.stderr


def test_trace_on_copies_published_messages_to_amq_rabbitmq_trace(target, vhost):
    assert target.ok("trace_on", "-p", vhost) == \
        'Starting tracing for vhost "%s" ...\nTrace enabled for vhost %s\n' % (vhost, vhost)
    assert target.ok("trace_on", "-p", vhost, "-q") == "Trace enabled for vhost %s\n" % vhost  # the result stays
    assert "%s\ttrue" % vhost in target.ok("list_vhosts", "name", "tracing").splitlines()
    connection = target.connect(vhost)
    channel = connection.channel()
    channel.confirm_delivery()
    trace = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(trace, "amq.rabbitmq.trace", "publish.#")
    channel.queue_declare("traced")
    channel.basic_publish("", "traced", b"look")
    got = wait_for(lambda: (lambda m: m if m[0] else None)(channel.basic_get(trace, auto_ack=True)))
    assert got[0].routing_key == "publish."  # "publish." + the exchange name, "" for the default one
    assert got[1].headers["routing_keys"] == ["traced"]
    assert got[2] == b"look"
    assert target.ok("trace_off", "-p", vhost) == \
        'Stopping tracing for vhost "%s" ...\nTrace disabled for vhost %s\n' % (vhost, vhost)
    channel.basic_publish("", "traced", b"unseen")
    assert channel.queue_declare("traced", passive=True).method.message_count == 2
    assert channel.basic_get(trace, auto_ack=True)[0] is None
    connection.close()


def test_status_describes_the_node(target):
    out = target.ok("status")
    lines = out.splitlines()
    assert lines[0].startswith("Status of node ") and lines[0].endswith(" ...")
    for section in ("Runtime", "Alarms", "Memory", "File Descriptors", "Free Disk Space", "Totals", "Listeners"):
        assert section in lines
    assert any(line.startswith("Interface: ") and "protocol: amqp" in line for line in lines)
    status = json.loads(target.ok("status", "--formatter", "json"))
    assert status["alarms"] == []
    assert status["totals"]["virtual_host_count"] >= 1


def test_set_vm_memory_high_watermark(hutch_only, target):
    node = json.loads(target.ok("status", "--formatter", "json"))["node"]
    assert target.ok("set_vm_memory_high_watermark", "0.5") == "Setting memory threshold on %s to 0.5 ...\n" % node
    assert target.ok("set_vm_memory_high_watermark", "absolute", "2GB") == \
        "Setting memory threshold on %s to 2GB bytes ...\n" % node
    assert json.loads(target.ok("status", "--formatter", "json"))["memory"]["limit"] == 2_000_000_000
    target.ok("set_vm_memory_high_watermark", "0.4")


def test_wrong_password_is_refused_with_noperm(target):
    result = target.run("list_vhosts", env={"HUTCH_PASSWORD": "wrong"})
    assert result.returncode == 77
    assert "refused the credentials of user 'guest'" in result.stderr


def test_set_disk_free_limit(hutch_only, target):
    node = json.loads(target.ok("status", "--formatter", "json"))["node"]
    assert target.ok("set_disk_free_limit", "60MB") == "Setting disk free limit on %s to 60MB bytes ...\n" % node
    assert json.loads(target.ok("status", "--formatter", "json"))["disk_free_limit"] == 60_000_000
    assert target.ok("set_disk_free_limit", "mem_relative", "0.001") == \
        "Setting disk free limit on %s to 0.001 times the total RAM ...\n" % node
    assert json.loads(target.ok("status", "--formatter", "json"))["disk_free_limit"] < 60_000_000
    target.ok("set_disk_free_limit", "50000000")
    assert json.loads(target.ok("status", "--formatter", "json"))["disk_free_limit"] == 50_000_000


@pytest.mark.parametrize("args, code, reason", [
    (("foo",), 65, "Bad argument."),
    (("mem_relative", "x"), 65, "Bad argument."),
    (("mem_relative",), 64, "not enough arguments."),
    (("1", "2"), 64, "too many arguments."),
])
def test_set_disk_free_limit_validates_its_arguments(target, args, code, reason):
    result = target.run("set_disk_free_limit", *args)
    assert result.returncode == code
    assert result.stderr.startswith("Error (argument validation): %s\n" % reason)


# -- the README's own sequence, and who may do what -------------------------------------------

def readme_sequence() -> list[list[str]]:
    """The hutchctl commands of the README's CLI example, one argv each
    (`&&` chains split, comments dropped), in order."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("`hutchctl` is rabbitmqctl over the management HTTP API", 1)[1]
    block = block.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            command, words = (words[:words.index("&&")], words[words.index("&&") + 1:]) if "&&" in words \
                else (words, [])
            assert command[0] == "hutchctl", line
            commands.append(command[1:] + (["# hutch"] if "# hutch:" in line else []))
    return commands


def test_the_readme_sequence_runs(target, tmp_path):
    """As a new user types it, with fresh names for its vhost and user (the
    brokers are shared): the creating user gets full permissions on the new
    vhost, so it may declare the queues and set the policy there."""
    vhost, user = unique("orders"), unique("app")
    renames = {"orders": vhost, "app": user, "/tmp/defs.json": str(tmp_path / "defs.json")}
    commands = [[renames.get(word, word) for word in argv] for argv in readme_sequence()]
    assert [next(w for i, w in enumerate(argv) if w[0] != "-" and argv[i - 1] != "-p") for argv in commands] == [
        "list_queues", "add_vhost", "add_user", "set_permissions", "set_policy",
        "peek", "move", "trace_on", "export_definitions"]
    try:
        for argv in commands:
            if argv[-1] == "# hutch":
                if not target.is_hutch:
                    continue  # hutch's own commands: RabbitMQ's API has no such endpoint
                argv = argv[:-1]
            if "peek" in argv:  # the queues of the example, declared by the vhost's creator
                connection = target.connect(vhost)
                connection.channel().queue_declare("work.dlq", durable=True)
                connection.channel().queue_declare("work", durable=True)
                connection.close()
            result = target.run(*argv)
            assert result.returncode == 0, (argv, result.returncode, result.stderr)
        exported = json.loads((tmp_path / "defs.json").read_text())
        assert {"vhost": vhost, "user": "guest", "configure": ".*", "write": ".*", "read": ".*"} \
            in exported["permissions"]
        assert {"vhost": vhost, "user": user, "configure": "^app\\.", "write": ".*", "read": ".*"} \
            in exported["permissions"]
        assert [p["name"] for p in exported["policies"] if p["vhost"] == vhost] == ["cap"]
    finally:
        target.http("DELETE", "/api/vhosts/" + vhost)
        target.http("DELETE", "/api/users/" + user)


def test_an_administrator_sets_policies_and_parameters_where_it_has_no_permissions(target):
    name = unique("nop")
    assert target.http("PUT", "/api/vhosts/" + name, {}) == 201
    try:
        assert target.http("DELETE", "/api/permissions/%s/guest" % name) == 204
        target.ok("set_policy", "-p", name, "cap", "^w", '{"max-length":5}')
        assert target.http("GET", "/api/policies/%s/cap" % name) == 200
        target.ok("clear_policy", "-p", name, "cap")
        assert target.http("GET", "/api/policies/%s/cap" % name) == 404
        target.ok("set_parameter", "-p", name, "federation-upstream", "up", '{"uri": "amqp://upstream.example"}')
        assert target.http("GET", "/api/parameters/federation-upstream/%s/up" % name) == 200
        target.ok("clear_parameter", "-p", name, "federation-upstream", "up")
        assert target.http("GET", "/api/parameters/federation-upstream/%s/up" % name) == 404
    finally:
        target.http("DELETE", "/api/vhosts/" + name)


def test_not_authorised_is_told_from_refused_credentials(target):
    """Both are HTTP 401 on RabbitMQ; only a failed login challenges the
    credentials again. Both exit 77 (EX_NOPERM), each with its own message."""
    vhost, user = unique("na"), unique("pm")
    assert target.http("PUT", "/api/vhosts/" + vhost, {}) == 201
    assert target.http("PUT", "/api/users/" + user, {"password": "pw", "tags": "policymaker"}) == 201
    try:
        as_user = {"HUTCH_USERNAME": user, "HUTCH_PASSWORD": "pw"}
        for argv in (["set_policy", "-p", vhost, "cap", "^w", '{"max-length":5}'], ["list_queues", "-p", vhost]):
            result = target.run(*argv, env=as_user)
            assert result.returncode == 77, (argv, result.stderr)
            assert ("accepted the credentials of user '%s' but did not authorise this operation" % user) \
                in result.stderr, result.stderr
            assert "refused the credentials" not in result.stderr
        refused = target.run("list_queues", "-p", vhost, env={**as_user, "HUTCH_PASSWORD": "wrong"})
        assert refused.returncode == 77
        assert "refused the credentials of user '%s'" % user in refused.stderr
    finally:
        target.http("DELETE", "/api/vhosts/" + vhost)
        target.http("DELETE", "/api/users/" + user)
