"""Federation on hutch: federated exchanges and queues, between two vhosts
of the session broker (a federation link is an AMQP client: another vhost
is as remote as another broker), and the links' status."""
from __future__ import annotations

import json

import pika
import pytest

from helpers import confirm_channel_in, wait_for
from http_api import Api, segment
from hutchctl_targets import hutch_target

pytestmark = pytest.mark.timeout(90)


def federate(api, broker, downstream: str, upstream: str, pattern: str, **keys) -> None:
    """Upstream "up" in `downstream` pointing at vhost `upstream`, and a policy applying it."""
    value = {"uri": "amqp://guest:guest@127.0.0.1:%d/%s" % (broker.port, segment(upstream)), **keys}
    assert api.put("/api/parameters/federation-upstream/%s/up" % segment(downstream), {"value": value}).status == 201
    assert api.put("/api/policies/%s/fed" % segment(downstream),
                   {"pattern": pattern, "definition": {"federation-upstream": "up"}}).status == 201


def links_of(api, vhost: str, state: str = "running") -> list:
    return [link for link in api.get("/api/federation-links/" + segment(vhost)).body if link["status"] == state]


def test_federated_exchange_receives_only_what_its_bindings_match(broker, api, make_vhost):
    up, down = make_vhost(), make_vhost()
    up_connection, up_channel = confirm_channel_in(broker, up)
    up_channel.exchange_declare("fx", "topic", durable=True)
    down_connection, down_channel = confirm_channel_in(broker, down)
    down_channel.exchange_declare("fx", "topic", durable=True)
    down_channel.queue_declare("dq")
    down_channel.queue_bind("dq", "fx", "a.#")
    federate(api, broker, down, up, "^fx$", **{"max-hops": 1})
    (link,) = wait_for(lambda: links_of(api, down), 30)
    assert (link["type"], link["exchange"], link["upstream_exchange"], link["upstream"]) == \
        ("exchange", "fx", "fx", "up")
    # the downstream's binding reaches the upstream
    wait_for(lambda: any(b["routing_key"] == "a.#" and b["destination"].startswith("federation: fx to ")
                         for b in api.get("/api/bindings/" + segment(up)).body), 30)
    for key in ("a.1", "b.1", "a.2"):
        up_channel.basic_publish("fx", key, key.encode(), pika.BasicProperties(delivery_mode=2))
    got = []
    wait_for(lambda: (got.append(down_channel.basic_get("dq", auto_ack=True)) or len([g for g in got if g[0]]) >= 2),
             30)
    messages = [g for g in got if g[0]]
    assert [body for _m, _p, body in messages] == [b"a.1", b"a.2"]
    (hop,) = messages[0][1].headers["x-received-from"]
    assert (hop["exchange"], hop["redelivered"]) == ("fx", False)
    assert hop["uri"].endswith("/" + segment(up)) and "guest:guest" not in hop["uri"]
    # b.1 never crossed: nothing bound it upstream
    federation_queue = [q for q in api.get("/api/queues/" + segment(up)).body if q["name"].startswith("federation:")]
    assert len(federation_queue) == 1 and federation_queue[0]["messages"] == 0
    # an unbind downstream is an unbind upstream
    down_channel.queue_unbind("dq", "fx", "a.#")
    wait_for(lambda: not any(b["routing_key"] == "a.#" for b in api.get("/api/bindings/" + segment(up)).body), 30)
    status = hutch_target(broker).run("federation_status", "--formatter", "json")
    assert status.returncode == 0, status.stderr
    assert any(row["exchange"] == "fx" and row["vhost"] == down and row["status"] == "running"
               for row in json.loads(status.stdout))
    up_connection.close()
    down_connection.close()


def test_federated_queue_pulls_only_while_its_consumers_want_messages(broker, api, make_vhost):
    up, down = make_vhost(), make_vhost()
    up_connection, up_channel = confirm_channel_in(broker, up)
    up_channel.queue_declare("fq", durable=True)
    for i in range(5):
        up_channel.basic_publish("", "fq", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    down_connection, down_channel = confirm_channel_in(broker, down)
    down_channel.queue_declare("fq", durable=True)
    federate(api, broker, down, up, "^fq$")
    (link,) = wait_for(lambda: links_of(api, down), 30)
    assert (link["type"], link["queue"], link["upstream_queue"]) == ("queue", "fq", "fq")
    # no consumer downstream: the messages stay upstream
    assert up_channel.queue_declare("fq", passive=True).method.message_count == 5
    assert down_channel.queue_declare("fq", passive=True).method.message_count == 0
    got = []
    down_channel.basic_qos(prefetch_count=10)
    down_channel.basic_consume("fq", lambda ch, method, props, body: (got.append(body),
                                                                          ch.basic_ack(method.delivery_tag)))
    wait_for(lambda: down_connection.process_data_events(0.05) or len(got) == 5, 30)
    assert sorted(got) == [b"%d" % i for i in range(5)]
    assert up_channel.queue_declare("fq", passive=True).method.message_count == 0
    up_connection.close()
    down_connection.close()


def test_a_ring_of_two_federated_exchanges_delivers_once(broker, api, make_vhost):
    """A and B federate each other's exchange "ring" with max-hops 2: a
    message published at A crosses to B once and is not sent back (A finds
    its own name in x-received-from)."""
    a, b = make_vhost(), make_vhost()
    channels = {}
    for here, there in ((a, b), (b, a)):
        connection, channel = confirm_channel_in(broker, here)
        channel.exchange_declare("ring", "fanout", durable=True)
        channel.queue_declare("seen")
        channel.queue_bind("seen", "ring")
        channels[here] = (connection, channel)
        federate(api, broker, here, there, "^ring$", **{"max-hops": 2})
    for here in (a, b):
        wait_for(lambda: links_of(api, here), 30)
        wait_for(lambda: any(bnd["destination"].startswith("federation: ring")
                             for bnd in api.get("/api/bindings/" + segment(here)).body), 30)
    channels[a][1].basic_publish("ring", "", b"once")
    wait_for(lambda: channels[b][1].queue_declare("seen", passive=True).method.message_count == 1, 30)

    def federation_queues_empty():
        queues = [q for vh in (a, b) for q in api.get("/api/queues/" + segment(vh)).body
                  if q["name"].startswith("federation:")]
        return len(queues) == 2 and all(q["messages"] == 0 for q in queues)
    wait_for(federation_queues_empty, 30)
    assert channels[a][1].queue_declare("seen", passive=True).method.message_count == 1
    assert channels[b][1].queue_declare("seen", passive=True).method.message_count == 1
    for connection, _channel in channels.values():
        connection.close()


def test_links_follow_policies_and_report_errors(broker, api, make_vhost):
    down = make_vhost()
    connection, channel = confirm_channel_in(broker, down)
    channel.exchange_declare("lonely", "direct")
    value = {"uri": "amqp://guest:guest@127.0.0.1:1/", "reconnect-delay": 0.2}
    assert api.put("/api/parameters/federation-upstream/%s/nowhere" % segment(down), {"value": value}).status == 201
    assert api.put("/api/parameters/federation-upstream-set/%s/set" % segment(down),
                   {"value": [{"upstream": "nowhere"}]}).status == 201
    assert api.put("/api/policies/%s/fed" % segment(down),
                   {"pattern": "^lonely$", "definition": {"federation-upstream-set": "set"}}).status == 201
    (link,) = wait_for(lambda: links_of(api, down, "error"), 30)
    assert link["upstream"] == "nowhere" and "cannot connect to the upstream" in link["error"]
    assert api.delete("/api/policies/%s/fed" % segment(down)).status == 204
    wait_for(lambda: api.get("/api/federation-links/" + segment(down)).body == [], 30)
    connection.close()


def test_links_between_two_brokers_come_back_with_the_downstream(start_broker):
    """Hutch to hutch across processes: the federated exchange's link comes
    back when the downstream restarts (policies and upstreams are durable)."""
    up = start_broker(expect=("AMQP", "HTTP"))
    down = start_broker(expect=("AMQP", "HTTP"))
    api = Api(down.ports["HTTP"])
    connection = pika.BlockingConnection(pika.URLParameters(down.url))
    channel = connection.channel()
    channel.exchange_declare("events", "topic", durable=True)
    channel.queue_declare("mine", durable=True)
    channel.queue_bind("mine", "events", "site.#")
    connection.close()
    assert api.put("/api/parameters/federation-upstream/%2F/up", {"value": {"uri": up.url}}).status == 201
    assert api.put("/api/policies/%2F/fed", {"pattern": "^events$", "apply-to": "exchanges",
                                            "definition": {"federation-upstream": "up"}}).status == 201
    wait_for(lambda: links_of(api, "/"), 30)
    down.stop()
    down = start_broker("--data-dir", str(down.data_dir), expect=("AMQP", "HTTP"))
    api = Api(down.ports["HTTP"])
    wait_for(lambda: links_of(api, "/"), 30)
    up_api = Api(up.ports["HTTP"])
    wait_for(lambda: any(b["routing_key"] == "site.#" for b in up_api.get("/api/bindings/%2F").body), 30)
    up_connection, up_channel = confirm_channel_in(up, "/")
    up_channel.exchange_declare("events", "topic", passive=True)  # the link declared it upstream
    up_channel.basic_publish("events", "site.a", b"crossed", pika.BasicProperties(delivery_mode=2))
    up_connection.close()
    down_connection, down_channel = confirm_channel_in(down, "/")
    wait_for(lambda: down_channel.queue_declare("mine", passive=True).method.message_count == 1, 30)
    assert down_channel.basic_get("mine", auto_ack=True)[2] == b"crossed"
    down_connection.close()
