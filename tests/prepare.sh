#!/usr/bin/env bash
# What the test suite needs besides Python packages, for a newcomer and CI alike (the README's
# test command runs this first; .ci/run runs that command). Safe to run twice.
#
# 1. Debian packages: RabbitMQ with its plugins (the differential tests in tests/differential and
#    the hutchctl tests compare hutch with it), Mosquitto (the MQTT differential tests start their
#    own), etcd (the cluster tests start their own, tests/cluster_kit.py), nftables, iproute2 and
#    faketime (the partition harness, tests/partition_kit.py: network namespaces partitioned
#    with nftables, a clock skewed with libfaketime), the rabbitmq-c tools,
#    php-amqplib and Ruby's Bunny (clients compared on hutch and RabbitMQ), a Java runtime (Spark,
#    for spark_sink and its tests), a C compiler (the install builds the C twins of the hot paths,
#    amqp_server/amqp/_framing.c), Chromium with its WebDriver (tests/test_ui.py), and Node.js
#    with npm (the JavaScript stream client, which step 3 installs).
#    Run as root with apt-get at hand, it installs what is missing; otherwise it says what is
#    missing and which tests will skip (or fail, when CI is set).
# 2. RabbitMQ's plugins enabled and RabbitMQ started, unless something listens on 127.0.0.1:5672.
# 3. tests/client_scripts' npm packages (rabbitmq-stream-js-client, tests/test_stream_protocol.py).
set -uo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
export PATH="$PATH:/usr/sbin:/sbin"
RABBITMQ_PORT=5672
STARTUP_SECONDS=120

say() { echo "prepare: $*"; }

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/${RABBITMQ_PORT}") 2>/dev/null
}

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

# package -> the tests that need it (what a newcomer without it loses)
declare -A NEEDED_BY=(
    [default-jre-headless]="Spark: tests/test_spark_*.py; the Java stream client's compression codecs (tests/test_stream_protocol.py)"
    [rabbitmq-server]="the differential tests (tests/differential), the hutchctl tests against RabbitMQ"
    [mosquitto]="tests/test_mqtt_differential.py"
    [gcc]="the C twins' tests (tests/test_fastpath.py, tests/test_framing.py)"
    [chromium]="the web UI's browser tests (tests/test_ui.py)"
    [chromium-driver]="the web UI's browser tests (tests/test_ui.py)"
    [amqp-tools]="tests/differential/test_diff_clients.py (rabbitmq-c tools)"
    [php-cli]="tests/differential/test_diff_clients.py (php-amqplib)"
    [php-amqplib]="tests/differential/test_diff_clients.py (php-amqplib)"
    [ruby-bunny]="tests/differential/test_diff_clients.py (Bunny)"
    [etcd-server]="the cluster tests (tests/test_cluster_*.py)"
    [nftables]="the partition harness (tests/test_cluster_partitions.py, bench/partitions.py)"
    [iproute2]="the partition harness (tests/test_cluster_partitions.py, bench/partitions.py)"
    [faketime]="the partition harness's clock-skew fault (bench/partitions.py)"
    [nodejs]="the JavaScript stream client's test (tests/test_stream_protocol.py)"
    [npm]="the JavaScript stream client's test (tests/test_stream_protocol.py)"
)

missing=()
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
installed rabbitmq-server || missing+=(rabbitmq-server)
command -v mosquitto >/dev/null 2>&1 || missing+=(mosquitto)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
installed chromium || missing+=(chromium)
installed chromium-driver || missing+=(chromium-driver)
command -v amqp-publish >/dev/null 2>&1 || missing+=(amqp-tools)
command -v php >/dev/null 2>&1 || missing+=(php-cli)
[ -e /usr/share/php/PhpAmqpLib/autoload.php ] || missing+=(php-amqplib)
installed ruby-bunny || missing+=(ruby-bunny)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || missing+=(faketime)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing ${missing[*]}"
        apt-get update
        # Keep the packages' init scripts from starting services inside apt (they fail in
        # containers without an init system): RabbitMQ is started below, mosquitto and etcd
        # by the tests that need them.
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
            chmod 755 /usr/sbin/policy-rc.d
            trap 'rm -f /usr/sbin/policy-rc.d' EXIT
        fi
        apt-get install -y --no-install-recommends "${missing[@]}" || say "apt-get install failed (exit $?)"
    else
        say "not root with apt-get at hand: these Debian packages are missing, and the tests that need"
        say "them will skip (or fail when CI is set):"
        for package in "${missing[@]}"; do
            say "  ${package}: ${NEEDED_BY[$package]}"
        done
        say "install them with: sudo apt-get install -y ${missing[*]}"
    fi
fi

# The JavaScript stream client (before RabbitMQ, whose absence ends this script).
if command -v npm >/dev/null 2>&1; then
    npm install --prefix tests/client_scripts --no-audit --no-fund >/dev/null \
        || say "could not install tests/client_scripts' npm packages"
fi

# A running node is asked directly; otherwise --offline edits the enabled-plugins file, which
# the start below reads. Shovel and federation are the reference for hutch's links
# (tests/differential/test_links_interop.py), the stream plugin (port 5552) for the stream
# protocol (tests/differential/test_diff_stream_protocol.py).
PLUGINS=(rabbitmq_management rabbitmq_shovel rabbitmq_shovel_management rabbitmq_federation
         rabbitmq_federation_management rabbitmq_stream)
if ! command -v rabbitmq-server >/dev/null 2>&1; then
    port_open || say "no RabbitMQ: ${NEEDED_BY[rabbitmq-server]} will skip (or fail when CI is set)"
    exit 0
fi
if port_open; then
    rabbitmq-plugins enable "${PLUGINS[@]}" >/dev/null || say "could not enable ${PLUGINS[*]}"
else
    rabbitmq-plugins --offline enable "${PLUGINS[@]}" >/dev/null || say "could not enable ${PLUGINS[*]}"
fi

if port_open; then
    say "something already listens on port ${RABBITMQ_PORT}; using it as the reference RabbitMQ"
else
    say "starting rabbitmq-server"
    rabbitmq-server -detached || say "rabbitmq-server -detached exited with $?"
    deadline=$((SECONDS + STARTUP_SECONDS))
    until port_open; do
        if [ "${SECONDS}" -ge "${deadline}" ]; then
            say "RabbitMQ did not listen on port ${RABBITMQ_PORT} within ${STARTUP_SECONDS} s; its logs:"
            tail -n 40 /var/log/rabbitmq/*.log /var/log/rabbitmq/startup_* 2>/dev/null || true
            break
        fi
        sleep 1
    done
    if port_open; then
        timeout 60 rabbitmqctl await_startup >/dev/null 2>&1 || true
        say "RabbitMQ is up after $((SECONDS)) s"
    fi
fi
exit 0
