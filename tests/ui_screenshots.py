"""The screenshots of docs/ui.md: a broker from this checkout with a little
traffic (queues with messages, a consumer, dead letters of three reasons, a
policy, a stream; the default exchange's and the traffic channel's pages), then a three-node cluster of three shards per
node (tests/cluster_kit.py: etcd and hutch nodes), shown by the same headless browser as tests/test_ui.py.

    python tests/ui_screenshots.py docs/ui
"""
from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pika

from browser import Ui
from cluster_kit import shard_leaders, spread, until
from conftest import launch
from http_api import Api, call


def traffic(port: int, stop: threading.Event) -> None:
    with pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:%d/" % port)) as connection:
        channel = connection.channel()
        channel.queue_declare("orders.dead")
        channel.queue_declare("orders", arguments={"x-dead-letter-exchange": "",
                                                   "x-dead-letter-routing-key": "orders.dead"})
        channel.queue_declare("invoices", arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "",
                                                     "x-dead-letter-routing-key": "orders.dead"})
        channel.queue_declare("audit", arguments={"x-max-length": 5, "x-dead-letter-exchange": "",
                                                  "x-dead-letter-routing-key": "orders.dead"})
        channel.queue_declare("events")
        channel.queue_declare("clicks", durable=True, arguments={"x-queue-type": "stream", "x-max-age": "7D",
                                                                "x-stream-max-segment-size-bytes": 1000000})
        for i in range(250):
            channel.basic_publish("", "clicks", b'{"page": "/orders/%d"}' % i)
        for i in range(30):
            time.sleep(0.1)  # dead letters spread over a few seconds, for the charts
            props = pika.BasicProperties(content_type="application/json", message_id="order-%d" % i)
            channel.basic_publish("", "orders", b'{"order": %d, "total": 12.5}' % i, props)
            channel.basic_publish("", "invoices", b"invoice %d" % i)
            channel.basic_publish("", "audit", b"audit %d" % i)
        for _ in range(12):
            method, _props, _body = channel.basic_get("orders")
            channel.basic_reject(method.delivery_tag, requeue=False)
        channel.basic_qos(prefetch_count=5)
        channel.basic_consume("orders", lambda ch, m, p, b: None)  # holds 5 unacked
        while not stop.is_set():
            channel.basic_publish("", "events", b"tick")
            connection.process_data_events(time_limit=0.05)


def main(folder: str) -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    broker = launch(Path(tempfile.mkdtemp(prefix="hutch-shots-")), expect=("AMQP", "HTTP"))
    stop = threading.Event()
    worker = threading.Thread(target=traffic, args=(broker.port, stop), daemon=True)
    ui = None
    try:
        worker.start()
        api = Api(broker.ports["HTTP"])
        api.put("/api/policies/%2F/short-events", {"pattern": "^events$", "definition": {"max-length": 100000},
                                                  "apply-to": "queues"})
        ui = Ui(broker.ports["HTTP"])
        ui.driver.set_window_size(1200, 820)
        ui.login("guest", "guest")
        ui.one("#tab-queues")
        ui.driver.execute_script("sessionStorage.setItem('hutch.chart-range', '60')")  # the charts' last minute
        time.sleep(30)  # six samples (every 5 s) of traffic in the broker's history
        ui.open("")
        shots = [("overview", ""), ("queues", "queues"), ("queue", "queues/%2F/orders"),
                 ("connections", "connections"), ("exchanges", "exchanges"), ("dead-letters", "dead-letters"),
                 ("policies", "policies"), ("stream", "queues/%2F/clicks")]
        for name, route in shots:
            if route:  # the overview is open, with its charts filled
                ui.open(route)
            ui.wait(lambda: ui.find("#view table"), "a table on #/" + route)
            if route in ("", "queues/%2F/orders"):
                ui.wait(lambda: ui.find(".chart[data-points]"), "the charts drawn")
            if route == "queues/%2F/clicks":  # from its Stream section on
                ui.wait(lambda: ui.find("#stream-details td"), "the stream's details")
                ui.driver.execute_script("document.getElementById('stream-details').parentElement.scrollIntoView()")
            ui.screenshot(str(out / (name + ".png")))
        # an exchange's and a channel's pages (the traffic's channel publishes, gets and consumes)
        traffic_channel = next(ch["name"] for ch in api.get("/api/channels").body if ch.get("message_stats"))
        for name, route in (("exchange", "exchanges/%2F/amq.default"),
                            ("channel", "channels/" + quote(traffic_channel, safe=""))):
            ui.open(route)
            ui.wait(lambda: ui.find(".chart[data-points]") and ui.find("#view table"), "the charts drawn")
            ui.driver.execute_script("window.scrollTo(0, 0)")
            ui.screenshot(str(out / (name + ".png")))
        ui.open("users/guest")
        ui.wait(lambda: ui.find("#update-user-tags"), "the user's form")
        ui.driver.execute_script("document.getElementById('update-user').scrollIntoView()")
        ui.screenshot(str(out / "user.png"))
        ui.login("guest", "wrong")
        ui.wait_text("#login-error", "Login failed")
        ui.screenshot(str(out / "login.png"))
    finally:
        stop.set()
        if ui is not None:
            ui.close()
        worker.join(5)
        broker.stop()
    cluster(out)


def cluster(out: Path) -> None:
    """cluster.png and cluster-queues.png: a three-node cluster of three shards per node, each node
    leading one (docs/scaling.md), opened through a follower of shard 0's group: the overview's
    node table, and queues of every shard with their leaders."""
    with spread(Path(tempfile.mkdtemp(prefix="hutch-shots-cluster-")), 3, 3) as (etcd, nodes):
        leaders = shard_leaders(etcd, 3)
        follower = next(n for n in nodes if n.name != leaders[0])
        with pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:%d/" % follower.port)) as c:
            channel = c.channel()
            for name in ("billing", "emails", "orders", "payments", "reports", "shipping"):
                channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
                for i in range(len(name) * 7):
                    channel.basic_publish("", name, b"%d" % i)
        until(lambda: sum("mem_used" in n for n in call(follower.ports["http"], "GET", "/api/nodes").body) == 3,
              30, "every member's figures")
        until(lambda: all("leader" in q for q in call(follower.ports["http"], "GET", "/api/queues").body), 30,
              "every queue's leader known")
        ui = Ui(follower.ports["http"])
        try:
            ui.driver.set_window_size(1200, 820)
            ui.login("guest", "guest")
            ui.one("#tab-queues")
            ui.wait(lambda: len(ui.find("#nodes tbody tr")) == 3, "three nodes")
            ui.driver.execute_script("document.getElementById('nodes').parentElement.scrollIntoView()")
            ui.screenshot(str(out / "cluster.png"))
            ui.open("queues")
            ui.wait(lambda: len(ui.find("#queues tbody tr")) == 6, "six queues")
            ui.screenshot(str(out / "cluster-queues.png"))
        finally:
            ui.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/ui")
