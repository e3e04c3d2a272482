"""hutchctl without a broker: argument validation, exit statuses, where the
connection settings come from, an unreachable API, and the pure formatting of
values (tables as rabbitmqctl prints them).

The settings are observed through the unreachable-API message, which names
the URL it tried, and through the credentials a tiny local HTTP server sees.
"""
from __future__ import annotations

import base64
import http.server
import json
import socket
import subprocess
import sys
import threading

import pytest

from cli.hutchctl.formatters import Output
from cli.hutchctl.options import connection_settings
from cli.hutchctl.terms import Atoms, FieldTable, json_value, text
from hutchctl_targets import ROOT, clean_environ, hutchctl


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dead_url():
    return "http://127.0.0.1:%d" % free_port()


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers GET /api/vhosts with one vhost and remembers who asked."""

    seen: list = []
    vhosts = 1

    def do_GET(self):  # noqa: N802 - http.server's naming
        self.seen.append((self.path, self.headers.get("Authorization")))
        body = json.dumps([{"name": "vhost-%d" % i, "tracing": False} for i in range(self.vhosts)]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def api(request):
    """A local HTTP server standing in for the API; yields (url, requests seen).
    Parametrise indirectly with a number to have it list that many vhosts."""
    seen = []
    handler = type("Handler", (_Recorder,), {"seen": seen, "vhosts": getattr(request, "param", 1)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "http://127.0.0.1:%d" % server.server_address[1], seen
    server.shutdown()
    server.server_close()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode()


# -- unreachable broker ---------------------------------------------------------------------

def test_unreachable_api_gives_rabbitmqctls_message_and_status_69(dead_url):
    result = hutchctl("--url", dead_url, "list_queues")
    assert result.returncode == 69
    assert result.stderr.startswith("Error: unable to perform an operation on the broker at %s. "
                                    "Please see diagnostics information and suggestions below.\n" % dead_url)
    assert "attempted to contact: %s" % dead_url in result.stderr
    assert "Connection refused" in result.stderr
    # the banner comes first, as rabbitmqctl's does
    assert result.stdout == "Timeout: 60.0 seconds ...\nListing queues for vhost / ...\n"


def test_an_unresolvable_host_is_unreachable_too():
    result = hutchctl("--url", "http://no-such-host.invalid:15672", "list_vhosts", "-q")
    assert result.returncode == 69
    assert "no-such-host.invalid" in result.stderr
    assert result.stdout == ""


# -- settings: flag > environment > --config > default --------------------------------------

def test_url_comes_from_flag_then_environment_then_config_file(tmp_path):
    urls = ["http://127.0.0.1:%d" % free_port() for _ in range(3)]
    config = tmp_path / "hutchctl.yaml"
    config.write_text("url: %s\n" % urls[0])

    def contacted(*args, env=None):
        result = hutchctl(*args, env=env)
        assert result.returncode == 69, result.stderr
        return result.stderr.split("attempted to contact: ")[1].split("\n")[0]

    assert contacted("--config", str(config), "list_vhosts") == urls[0]
    assert contacted("--config", str(config), "list_vhosts", env={"HUTCH_URL": urls[1]}) == urls[1]
    assert contacted("--config", str(config), "list_vhosts", "--url", urls[2], env={"HUTCH_URL": urls[1]}) == urls[2]
    assert contacted("list_vhosts", "--url=%s" % urls[2]) == urls[2]


def test_without_settings_hutchctl_uses_rabbitmqs_default_api_and_guest():
    assert connection_settings({}, {}) == {"url": "http://127.0.0.1:15672", "username": "guest",
                                           "password": "guest"}


def test_credentials_come_from_flags_environment_and_config(api, tmp_path):
    url, seen = api
    config = tmp_path / "c.yaml"
    config.write_text("url: %s\nusername: fromfile\npassword: filepw\n" % url)
    assert hutchctl("--config", str(config), "list_vhosts").returncode == 0
    assert hutchctl("--config", str(config), "list_vhosts",
                    env={"HUTCH_USERNAME": "fromenv", "HUTCH_PASSWORD": "envpw"}).returncode == 0
    assert hutchctl("--config", str(config), "-u", "fromflag", "--password", "flagpw", "list_vhosts",
                    env={"HUTCH_USERNAME": "fromenv"}).returncode == 0
    assert hutchctl("--url", url, "list_vhosts").returncode == 0
    assert [auth for _, auth in seen] == [basic("fromfile", "filepw"), basic("fromenv", "envpw"),
                                         basic("fromflag", "flagpw"), basic("guest", "guest")]
    assert seen[0][0] == "/api/vhosts"


def test_node_is_accepted_and_ignored_and_vhost_is_percent_encoded(api):
    url, seen = api
    result = hutchctl("--url", url, "-n", "rabbit@elsewhere", "list_queues", "-p", "my/vhost", "-q")
    assert result.returncode == 0
    assert seen[-1][0] == "/api/queues/my%2Fvhost"
    hutchctl("--url", url, "list_queues", "-q")
    assert seen[-1][0] == "/api/queues/%2F"


@pytest.mark.parametrize("content, message", [
    ("url: [1, 2]\n", "setting 'url' must be a string"),
    ("usrname: bob\n", "unknown setting 'usrname' (did you mean 'username'?)"),
    ("- a\n- b\n", "expected a mapping"),
    ("url: 'unterminated\n", "invalid YAML"),
])
def test_a_bad_config_file_is_reported_with_status_78(tmp_path, content, message):
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    result = hutchctl("--config", str(config), "list_vhosts")
    assert result.returncode == 78
    assert message in result.stderr


def test_a_missing_config_file_is_reported(tmp_path):
    result = hutchctl("--config", str(tmp_path / "none.yaml"), "list_vhosts")
    assert result.returncode == 78
    assert "cannot read the config file" in result.stderr


# -- argument validation (exit 64 unless rabbitmqctl says otherwise) -------------------------

@pytest.mark.parametrize("args, code, reason", [
    (["add_vhost"], 64, "not enough arguments."),
    (["add_vhost", "a", "b"], 64, "too many arguments."),
    (["set_permissions", "u", "a", "b"], 64, "not enough arguments."),
    (["list_queues", "nosuchitem", "name"], 64, "Info key(s) nosuchitem are not supported"),
    (["list_users", "user"], 64, "too many arguments."),
    (["list_queues", "--bogus", "3"], 64, "Invalid options for this command:\n--bogus : true"),
    (["list_queues", "--timeout", "7.5"], 64, "Invalid options for this command:\n--timeout : 7.5"),
    (["list_queues", "--formatter", "xml"], 64, "Unsupported formatter 'xml' (use one of: table, json, csv)"),
    (["list_queues", "-p"], 64, "option --vhost requires a value"),
    (["set_policy", "p", ".*", "{}", "--priority", "high"], 64, "Invalid options for this command:\n--priority : high"),
    (["set_vm_memory_high_watermark", "1.5"], 65, "Bad argument: The threshold should be a fraction between 0.0 and 1.0"),
    (["set_vm_memory_high_watermark", "absolute", "2XB"], 65, "Bad argument: Invalid units."),
    (["move", "q"], 64, "exactly one of --to-queue and --to-exchange is required"),
    (["move", "q", "--to-queue", "a", "--count", "-2"], 64, "Invalid options for this command:\n--count : -2"),
])
def test_bad_arguments_print_the_reason_and_usage(dead_url, args, code, reason):
    # the URL is dead: validation happens before anything is sent
    result = hutchctl("--url", dead_url, *args)
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("Error (argument validation): %s\nArguments given:\n\t--url %s %s\n\nUsage\n\n"
                                    % (reason, dead_url, " ".join(args)))
    assert "hutchctl [--node <node>] [--longnames] [--quiet] %s" % args[0] in result.stderr


def test_unknown_command_lists_the_commands():
    result = hutchctl("list_quues")
    assert result.returncode == 64
    assert result.stderr.startswith("\nCommand 'list_quues' not found. \n")
    assert "   list_queues " in result.stderr


def test_no_command_prints_usage_with_status_64():
    result = hutchctl("-q")
    assert result.returncode == 64
    assert "Usage" in result.stderr


def test_help_lists_every_required_command_and_shows_one_commands_usage():
    result = hutchctl("help")
    assert result.returncode == 0
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.startswith("   ")}
    assert {
        "status", "list_queues", "list_exchanges", "list_bindings", "list_connections", "list_channels",
        "list_consumers", "list_vhosts", "add_vhost", "delete_vhost", "list_users", "add_user", "delete_user",
        "change_password", "set_user_tags", "set_permissions", "clear_permissions", "list_permissions",
        "list_user_permissions", "set_topic_permissions", "set_policy", "clear_policy", "list_policies",
        "purge_queue", "delete_queue", "close_connection", "export_definitions", "import_definitions",
        "set_vm_memory_high_watermark", "trace_on", "trace_off", "peek", "move",
    } <= listed
    one = hutchctl("help", "set_policy")
    assert one.returncode == 0
    assert "hutchctl [--node <node>] [--longnames] [--quiet] set_policy [--vhost <vhost>] [--priority <priority>]" \
        in one.stdout


@pytest.mark.parametrize("flag", ["--help", "-?"])
def test_help_flags_print_usage_and_succeed(flag):
    general = hutchctl(flag)
    assert (general.returncode, general.stderr) == (0, "")
    assert "Available commands:" in general.stdout
    one = hutchctl("list_queues", flag)
    assert one.returncode == 0
    assert "hutchctl [--node <node>] [--longnames] [--quiet] list_queues [--vhost <vhost>]" in one.stdout


@pytest.mark.parametrize("api", [50000], indirect=True)
def test_a_reader_that_stops_early_ends_hutchctl_quietly(api):
    process = subprocess.Popen([sys.executable, "-m", "cli.hutchctl", "--url", api[0], "list_vhosts"], cwd=ROOT,
                               env=clean_environ(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline() == b"Listing vhosts ...\n"
    process.stdout.close()  # like `| head -1`
    assert process.wait(30) == 0
    assert process.stderr.read() == b""
    process.stderr.close()


def test_import_definitions_of_a_missing_file_is_a_data_error(dead_url, tmp_path):
    result = hutchctl("--url", dead_url, "import_definitions", str(tmp_path / "none.json"))
    assert result.returncode == 65
    assert "Bad argument: File %s does not exist" % (tmp_path / "none.json") in result.stderr


def test_import_definitions_nested_too_deeply_is_a_data_error(dead_url, tmp_path):
    source = tmp_path / "deep.json"
    source.write_text("[" * 100000 + "]" * 100000)
    result = hutchctl("--url", dead_url, "import_definitions", str(source))
    assert result.returncode == 65
    assert 'Failed to decode JSON from a file at "%s"' % source in result.stderr
    assert "Traceback" not in result.stderr


# -- hutch-server and hutchctl share a shell ---------------------------------------------------

def test_hutch_server_starts_with_hutchctls_environment_variables_set(start_broker):
    broker = start_broker(env={"HUTCH_URL": "http://127.0.0.1:1", "HUTCH_USERNAME": "u", "HUTCH_PASSWORD": "p"})
    assert broker.process.poll() is None
    assert broker.port > 0


# -- values and formats, as rabbitmqctl prints them -------------------------------------------

def test_field_tables_print_as_erlang_terms_and_typed_json():
    arguments = FieldTable({"x-s": "str", "x-b": True, "x-t": {"a": 1, "b": "x"}, "x-l": [1, "a"],
                            "x-big": 2**40, "x-neg": -3})
    assert text(arguments) == ('[{"x-s","str"},{"x-b",true},{"x-t",[{"a",1},{"b","x"}]},{"x-l",[1,"a"]},'
                               '{"x-big",1099511627776},{"x-neg",-3}]')
    # the same table as rabbitmqctl 3.10 --formatter json prints it (arrays become a map keyed by type)
    assert json_value(arguments) == [
        ["x-s", "longstr", "str"], ["x-b", "bool", True], ["x-t", "table", [["a", "signedint", 1],
                                                                             ["b", "longstr", "x"]]],
        ["x-l", "array", {"signedint": 1, "longstr": "a"}], ["x-big", "long", 1099511627776],
        ["x-neg", "signedint", -3]]
    assert text(FieldTable()) == "[]"


def test_scalars_and_atoms():
    assert [text(v) for v in (None, True, False, 3, 0.5, "plain \"s\"")] == ["", "true", "false", "3", "0.5",
                                                                           'plain "s"']
    assert text(Atoms(("management", "policymaker"))) == "[management, policymaker]"
    assert json_value(Atoms(("a",))) == ["a"]
    assert json_value(None) == ""


class _Stream:
    def __init__(self):
        self.parts = []

    def write(self, data):
        self.parts.append(data)

    @property
    def value(self):
        return "".join(self.parts)


@pytest.mark.parametrize("formatter, quiet, headers, expected", [
    ("table", False, True, "Listing ...\nname\tmessages\nq\"1\t3\n"),
    ("table", True, True, "name\tmessages\nq\"1\t3\n"),
    ("table", True, False, "q\"1\t3\n"),
    ("csv", False, True, '"name","messages"\n"q""1","3"\n'),
    ("json", False, True, '[\n{"name":"q\\"1","messages":3}\n]\n'),
])
def test_info_item_output(formatter, quiet, headers, expected):
    stream = _Stream()
    out = Output(formatter, quiet, headers, stream)
    out.banner("Listing ...")
    out.info_items(["name", "messages"], [['q"1', 3]])
    assert stream.value == expected


@pytest.mark.parametrize("formatter, shape, expected", [
    ("table", "info_items", ""), ("csv", "info_items", ""), ("json", "info_items", "[\n]\n"),
    ("table", "maps", "\n"), ("csv", "maps", ""), ("json", "maps", "[]\n"),
])
def test_empty_results_print_like_rabbitmqctl(formatter, shape, expected):
    stream = _Stream()
    getattr(Output(formatter, True, True, stream), shape)(["name"], [])
    assert stream.value == expected
