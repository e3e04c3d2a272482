"""The settings loader: documented defaults, precedence, and errors that name the key."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from amqp_server.shared.config import BrokerConfig, TLSConfig
from cli.settings import SettingsError, load_settings

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILE = ROOT / "config" / "hutch.yaml"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "hutch.yaml"
    path.write_text(text)
    return str(path)


def test_no_file_no_env_no_flags_gives_embedded_defaults():
    assert load_settings([], {}) == BrokerConfig()


def test_documented_file_equals_embedded_defaults():
    assert load_settings(["--config", str(DEFAULT_FILE)], {}) == BrokerConfig()


def test_documented_file_lists_every_setting():
    documented = yaml.safe_load(DEFAULT_FILE.read_text())
    assert documented == dataclasses.asdict(BrokerConfig())


def test_file_then_env_then_flags(tmp_path):
    path = write(tmp_path, "port: 1111\nbind: 10.0.0.1\nheartbeat: 5\nlog_level: debug\n")
    env = {"HUTCH_PORT": "2222", "HUTCH_BIND": "10.0.0.2"}
    config = load_settings(["--config", path, "--port", "3333"], env)
    assert (config.port, config.bind, config.heartbeat, config.log_level) == (3333, "10.0.0.2", 5, "debug")


def test_hutch_config_names_the_file_and_flag_overrides_it(tmp_path):
    a = write(tmp_path, "port: 1111\n")
    b = tmp_path / "other.yaml"
    b.write_text("port: 2222\n")
    assert load_settings([], {"HUTCH_CONFIG": a}).port == 1111
    assert load_settings(["--config", str(b)], {"HUTCH_CONFIG": a}).port == 2222


def test_required_flags():
    config = load_settings(
        ["--port", "0", "--bind", "127.0.0.1", "--data-dir", "/tmp/x", "--log-level", "warning"], {}
    )
    assert (config.port, config.bind, config.data_dir, config.log_level) == (0, "127.0.0.1", "/tmp/x", "warning")


def test_nested_tls_from_file_env_and_flags(tmp_path):
    path = write(tmp_path, "tls:\n  certfile: /c.pem\n  keyfile: /k.pem\n  verify_peer: true\n")
    config = load_settings(["--config", path, "--tls-port", "5999"], {"HUTCH_TLS_FAIL_IF_NO_PEER_CERT": "yes"})
    assert config.tls == TLSConfig(
        port=5999, certfile="/c.pem", keyfile="/k.pem", verify_peer=True, fail_if_no_peer_cert=True
    )
    assert config.tls.enabled


@pytest.mark.parametrize(("text", "value"), [("true", True), ("1", True), ("YES", True), ("no", False), ("0", False)])
def test_bool_text(text, value):
    assert load_settings([], {"HUTCH_TLS_VERIFY_PEER": text}).tls.verify_peer is value


def test_list_from_env_is_comma_separated():
    assert load_settings([], {"HUTCH_LOOPBACK_USERS": "guest, admin"}).loopback_users == ["guest", "admin"]
    assert load_settings([], {"HUTCH_LOOPBACK_USERS": ""}).loopback_users == []


def test_optional_accepts_null(tmp_path):
    path = write(tmp_path, "tls:\n  cacertfile: null\n")
    assert load_settings(["--config", path], {}).tls.cacertfile is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls:\n  cerfile: x\n", "unknown setting 'tls.cerfile'"),
        ("prot: 1\n", "unknown setting 'prot'"),
        ("port: abc\n", "setting 'port' must be an integer, got 'abc'"),
        ("port: true\n", "setting 'port' must be an integer"),
        ("port: 70000\n", "setting 'port' must be between 0 and 65535, got 70000"),
        ("tls:\n  port: -1\n", "setting 'tls.port' must be between 0 and 65535"),
        ("frame_max: 100\n", "setting 'frame_max' must be between 4096"),
        ("channel_max: 65536\n", "setting 'channel_max' must be between 0 and 65535"),
        ("heartbeat: -5\n", "setting 'heartbeat'"),
        ("log_level: loud\n", "setting 'log_level' must be one of debug, info, warning, error"),
        ("loopback_users: guest\n", "setting 'loopback_users' must be a list of strings"),
        ("tls: yes\n", "setting 'tls' must be a mapping"),
        ("tls:\n  verify_peer: 1\n", "setting 'tls.verify_peer' must be a boolean"),
        ("tls:\n  certfile: 5\n", "setting 'tls.certfile' must be a string or null"),
        ("tls:\n  certfile: /c.pem\n", "'tls.certfile' and 'tls.keyfile' must be set together"),
        ("- port\n", "expected a mapping of settings"),
        ("port: [\n", "invalid YAML"),
    ],
)
def test_file_errors_name_the_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(SettingsError, match=re.escape(message)):
        load_settings(["--config", path], {})


def test_missing_file():
    with pytest.raises(SettingsError, match="cannot read config file"):
        load_settings(["--config", "/nonexistent/hutch.yaml"], {})


def test_unknown_env_var_is_named():
    with pytest.raises(SettingsError, match="unknown environment variable 'HUTCH_PROT'"):
        load_settings([], {"HUTCH_PROT": "1"})


def test_other_env_vars_are_ignored():
    assert load_settings([], {"PORT": "1", "HUTCHX": "2"}) == BrokerConfig()


def test_bad_env_value_names_variable_and_key():
    with pytest.raises(SettingsError, match="HUTCH_PORT: setting 'port' must be an integer, got 'abc'"):
        load_settings([], {"HUTCH_PORT": "abc"})


def test_bad_flag_value_names_flag_and_key():
    with pytest.raises(SettingsError, match="--port: setting 'port' must be between 0 and 65535, got 99999"):
        load_settings(["--port", "99999"], {})


def test_server_reports_bad_config_without_traceback(tmp_path):
    path = write(tmp_path, "tls:\n  cerfile: x\n")
    result = subprocess.run(
        [sys.executable, "-m", "cli.server", "--config", path],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("hutch-server: ")
    assert "unknown setting 'tls.cerfile'" in result.stderr
    assert "Traceback" not in result.stderr


def readme_settings() -> set[str]:
    """The keys the README's settings table names: `a.b`, `.c` after a
    section key (`a.c`), and `_suffix` after a key (`a.b_suffix`)."""
    readme = (ROOT / "README.md").read_text()
    table = readme.split("| setting | flag | environment | default |", 1)[1].split("\n\n", 1)[0]
    named = set()
    for row in table.splitlines()[2:]:
        last = ""
        for name in re.findall(r"`([a-z_.]+)`", row.split("|")[1]):
            if name.startswith("."):
                name = last.rsplit(".", 1)[0] + name
            elif name.startswith("_"):
                name = last + name
            named.add(name)
            last = name
    return named


def test_every_setting_is_in_the_readme_table():
    from cli.settings import _leaves

    assert sorted(s.key for s in _leaves(BrokerConfig) if s.key not in readme_settings()) == []


def test_cluster_settings_from_flags_env_and_file(tmp_path):
    path = write(tmp_path, "cluster:\n  etcd: [http://10.0.0.1:2379]\n  lease_ttl: 7\n")
    config = load_settings(
        ["--config", path, "--cluster-node-name", "n1", "--cluster-replication-port", "6000",
         "--cluster-advertise", "10.0.0.5"],
        {"HUTCH_CLUSTER_ETCD": "http://10.0.0.1:2379, http://10.0.0.2:2379", "HUTCH_CLUSTER_MIN_IN_SYNC_REPLICAS": "1",
         "HUTCH_CLUSTER_SECRET": "s" * 16})
    cluster = config.cluster
    assert cluster.enabled
    assert cluster.etcd == ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
    assert (cluster.node_name, cluster.replication_port, cluster.advertise) == ("n1", 6000, "10.0.0.5")
    assert (cluster.lease_ttl, cluster.min_in_sync_replicas) == (7, 1)
    assert not BrokerConfig().cluster.enabled


@pytest.mark.parametrize("argv,message", [
    (["--cluster-etcd", "10.0.0.1:2379"], "'10.0.0.1:2379' is not an etcd client URL"),
    (["--cluster-etcd", "https://e:2379"], "is not an etcd client URL of the form http://host:port"),
    (["--cluster-etcd", "http://e"], "'http://e' is not an etcd client URL"),
    (["--cluster-etcd", "http://e:99999"], "'http://e:99999' is not an etcd client URL"),
    (["--cluster-node-name", "a b"], "setting 'cluster.node_name' must be letters"),
    (["--cluster-lease-ttl", "1"], "setting 'cluster.lease_ttl' must be between 2 and 3600"),
    (["--cluster-replication-port", "70000"], "setting 'cluster.replication_port' must be between 0 and 65535"),
    (["--cluster-etcd", "http://e:2379"], "setting 'cluster.secret' is required with 'cluster.etcd'"),
    (["--cluster-etcd", "http://e:2379", "--cluster-secret", "short"],
     "setting 'cluster.secret' must be at least 16 characters, got 5"),
    (["--cluster-tls-certfile", "/c.pem", "--cluster-tls-keyfile", "/k.pem"],
     "'cluster.tls_certfile', 'cluster.tls_keyfile' and 'cluster.tls_cacertfile' must be set together"),
    (["--cluster-replication-timeout", "0.5"], "setting 'cluster.replication_timeout' must be between"),
])
def test_mistyped_cluster_settings_are_refused(argv, message):
    with pytest.raises(SettingsError, match=re.escape(message)):
        load_settings(argv, {})
