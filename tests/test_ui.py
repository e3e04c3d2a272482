"""The management web UI in a real browser (headless Chromium, Selenium;
tests/browser.py) against the session broker: what it shows is checked
against the API, and what it does goes through the API.

One browser serves the module; tests/ui_screenshots.py drives the same
`browser.Ui` to make the screenshots of docs/ui.md.
"""
from __future__ import annotations

import http.server
import json
import threading
from urllib.parse import quote

import pika
import pytest

from browser import Ui, require_chromium
from conftest import ALL_PERMISSIONS
from helpers import unique, wait_for
from http_api import call, segment


# The questions RabbitMQ's UI asks before a destructive action.
CONFIRM_DELETE = "Are you sure? This object cannot be recovered after deletion."
CONFIRM_DELETE_QUEUE = "Are you sure? The queue is going to be deleted. Messages cannot be recovered after deletion."
CONFIRM_PURGE = "Are you sure? Messages cannot be recovered after purging."

PAGES = ["", "connections", "channels", "exchanges", "queues", "dead-letters", "users", "vhosts", "policies",
         "limits", "shovels", "federation"]


@pytest.fixture(scope="module")
def ui(broker):
    require_chromium()
    browser = Ui(broker.ports["HTTP"])
    browser.login("guest", "guest")
    browser.one("#tab-queues")
    yield browser
    browser.close()


@pytest.fixture
def guest(ui):
    """The module's browser, logged in as guest (a test may log in as another user)."""
    if not ui.find("#tab-queues") or not ui.one("#app").is_displayed() or ui.text("#whoami") != "guest":
        ui.login("guest", "guest")
        ui.one("#tab-queues")
    return ui


def test_ui_and_api_answers_carry_security_headers(broker):
    port = broker.ports["HTTP"]
    page = call(port, "GET", "/", auth=None)
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    assert 'name="username"' in page.body and 'name="password"' in page.body
    script = call(port, "GET", "/js/main.js", auth=None)
    assert script.status == 200 and "javascript" in script.headers["content-type"]
    for answer in (page, script, call(port, "GET", "/api/overview"), call(port, "GET", "/api/overview", auth=None)):
        assert "default-src 'self'" in answer.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert script.headers["cache-control"] == "no-cache"
    assert call(port, "GET", "/js/%2e%2e/%2e%2e/ui.py", auth=None).status in (403, 404)
    # the UI's own requests get no Basic challenge (no browser password dialog); other clients do
    assert "www-authenticate" in call(port, "GET", "/api/overview", auth=None).headers
    assert "www-authenticate" not in call(port, "GET", "/api/overview", auth=None,
                                          headers={"X-Requested-With": "XMLHttpRequest"}).headers


def test_every_page_opens_without_an_error(guest, api):
    for route in PAGES:
        guest.open(route)
        guest.wait(lambda: guest.find("#view table, #view p.muted"), "content of #/" + route)
        errors = [text for text in guest.texts("#view .error") if text]
        assert errors == [], (route, errors)
    guest.open("")
    totals = api.get("/api/overview").body["object_totals"]
    guest.wait(lambda: guest.find("#totals td"), "totals")
    cells = [text.replace(",", "") for text in guest.texts("#totals td")]
    assert cells[2] == str(totals["exchanges"])
    guest.wait(lambda: guest.find("#nodes td"), "nodes")
    node = api.get("/api/nodes").body[0]["name"]
    assert guest.texts("#nodes td")[0] == node
    guest.click_text("#nodes a", node)
    guest.wait_text("#view h1", node)
    guest.wait(lambda: guest.find("#node-details td"), "the node's details")
    # the node's memory over the chosen range, from its history
    guest.wait(lambda: int(_chart(guest, 0).get("max") or 0) > 0, "the node's memory chart")
    assert [text for text in guest.texts("#view .error") if text] == []


def test_queue_created_published_to_read_and_deleted_through_the_ui(guest, api):
    name = unique("ui-q")
    guest.open("queues")
    assert guest.submit("add-queue", {"name": name}) == "Queue added."
    assert api.get("/api/queues/%2F/" + segment(name)).body["durable"] is True
    guest.open("exchanges/%2F/amq.default")
    assert guest.submit("publish", {"routing_key": name, "payload": "hello from the browser"}) == "Message published."
    assert api.get("/api/queues/%2F/" + segment(name)).body["messages_ready"] == 1
    guest.open("queues/%2F/" + segment(name))
    guest.wait_text("#message-states", "alpha")
    assert guest.submit("get-messages") == "1 message(s)."
    assert guest.text("#got-messages .payload") == "hello from the browser"
    assert guest.submit("peek-messages") == "1 message(s) at the head; none taken."
    guest.submit("delete-queue", leaves=True, confirm=CONFIRM_DELETE_QUEUE)
    guest.wait(lambda: api.get("/api/queues/%2F/" + segment(name)).status == 404, "queue deleted")
    guest.wait(lambda: guest.driver.current_url.endswith("#/queues"), "back on the queue list")


def test_queue_list_filters_and_shows_what_the_api_shows(guest, api, vhost):
    names = [unique("ui-list") for _ in range(3)]
    for name in names:
        api.put("/api/queues/%s/%s" % (segment(vhost), segment(name)))
    api.post("/api/exchanges/%s/amq.default/publish" % segment(vhost),
             {"routing_key": names[0], "payload": "x", "payload_encoding": "string", "properties": {}})
    guest.open("queues")
    guest.filter("^" + names[1][:-3] + "...$", regex=True)
    guest.wait(lambda: guest.texts("#queues tbody tr td:nth-child(2)") == [names[1]], "one queue matching the regex")
    guest.filter(names[0])
    guest.wait(lambda: guest.texts("#queues tbody tr td:nth-child(2)") == [names[0]], "the filtered queue")
    row = guest.texts("#queues tbody tr td")
    shown = api.get("/api/queues/%s/%s" % (segment(vhost), segment(names[0]))).body
    assert row[1:3] == [names[0], "classic"]
    assert row[6:9] == [str(shown["messages_ready"]), "0", str(shown["messages"])]
    guest.filter("")


def test_policy_set_and_deleted_through_the_ui(guest, api):
    name = unique("ui-policy")
    guest.open("policies")
    assert guest.submit("add-policy", {"name": name, "pattern": "^ui-policed\\.",
                                       "definition": '{"max-length": 7}', "priority": "3"}) == "Policy set."
    found = api.get("/api/policies/%2F/" + name).body
    assert (found["pattern"], found["definition"], found["priority"]) == ("^ui-policed\\.", {"max-length": 7}, 3)
    guest.wait_text("#policies", name)
    # one row, though the form's refresh and the timer's may overlap (the page once drew a table for each)
    guest.wait(lambda: guest.texts("#policies tbody td:nth-child(2)").count(name) == 1, "the policy listed once")
    # clicked after the script returns: the question it asks blocks the page until answered
    guest.driver.execute_script("""
        for (const row of document.querySelectorAll('#policies tbody tr'))
          if (row.cells[1].innerText === arguments[0])
            setTimeout(() => row.querySelector('button.delete-policy').click(), 0);""", name)
    assert guest.confirmation() == CONFIRM_DELETE
    guest.wait(lambda: api.get("/api/policies/%2F/" + name).status == 404, "policy deleted")


def test_names_holding_html_are_shown_as_text(guest, api):
    name = unique('<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>')
    assert api.put("/api/queues/%2F/" + segment(name)).status == 201
    try:
        guest.open("queues")
        guest.filter(name[-10:])
        guest.wait(lambda: name in guest.texts("#queues tbody a"), "the queue's name as text")
        assert guest.find("#queues tbody img, #queues tbody script") == []
        guest.click_text("#queues tbody a", name)
        guest.wait(lambda: guest.text("#queue-name") == name, "the queue page")
        assert guest.driver.execute_script("return window.pwned === undefined")
    finally:
        api.delete("/api/queues/%2F/" + segment(name))
    guest.open("queues")
    guest.filter("")


def test_a_wrong_password_shows_a_readable_message(ui, api):
    ui.login("guest", "not-the-password")
    ui.wait_text("#login-error", "Login failed: wrong username or password")
    assert not ui.one("#app").is_displayed()
    assert ui.driver.execute_script("return sessionStorage.length") == 0


def test_a_management_user_sees_no_admin_pages(ui, api):
    name, password = unique("ui-mgmt"), "secret-1"
    api.put("/api/users/" + name, {"password": password, "tags": "management"})
    api.put("/api/permissions/%2F/" + name, ALL_PERMISSIONS)
    try:
        ui.login(name, password)
        ui.one("#tab-queues")
        assert ui.text("#whoami") == name
        assert ui.find("#tab-admin") == []
        ui.open("users")
        ui.wait_text("#view", "Not authorised")
        ui.open("")
        ui.wait(lambda: ui.find("#totals td"), "overview for a management user")
        assert ui.find("#nodes") == []  # node details are for monitoring users, as in RabbitMQ
        ui.logout()
        assert ui.driver.execute_script("return sessionStorage.length") == 0
    finally:
        api.delete("/api/users/" + name)


def test_a_connection_is_shown_and_closed_through_the_ui(guest, broker, api):
    name = unique("ui-conn")
    params = pika.URLParameters(broker.url)
    params.client_properties = {"connection_name": name}
    connection = pika.BlockingConnection(params)
    try:
        connection.channel()
        guest.open("connections")
        guest.filter("")
        found = guest.wait(lambda: next((c for c in api.get("/api/connections").body
                                         if c["client_properties"].get("connection_name") == name), None),
                           "the connection in the API")
        guest.click_text("#connections tbody a", found["name"])
        guest.wait_text("#view table", name)  # its client properties
        guest.wait(lambda: guest.texts("#view section table a") == [found["name"] + " (1)"], "its channel")
        guest.submit("close-connection", {"reason": "closed by the UI test"}, leaves=True, confirm=CONFIRM_DELETE)
        guest.wait(lambda: not connection.is_open or _closed(connection), "the client sees the close")
    finally:
        if connection.is_open:
            connection.close()


def _json_file(path):
    """The JSON in `path` once it is there and whole, else None."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _closed(connection) -> bool:
    try:
        connection.process_data_events(time_limit=0.05)
    except Exception:  # the broker's connection.close arrives as an exception
        return True
    return not connection.is_open


def test_peek_and_move_show_the_message_states_the_api_reports(guest, api, vhost):
    source, target = unique("ui-src"), unique("ui-dst")
    for name in (source, target):
        api.put("/api/queues/%s/%s" % (segment(vhost), segment(name)))
    for i in range(3):
        api.post("/api/exchanges/%s/amq.default/publish" % segment(vhost),
                 {"routing_key": source, "payload": "m%d" % i, "payload_encoding": "string", "properties": {}})
    guest.open("queues/%s/%s" % (segment(vhost), segment(source)))
    states = api.get("/api/queues/%s/%s" % (segment(vhost), segment(source))).body["message_states"]
    guest.wait(lambda: len(guest.texts("#message-states [data-state]")) == 4, "message states")
    shown = dict(text.split() for text in guest.texts("#message-states [data-state]"))
    assert set(shown) == {"alpha", "beta", "gamma", "delta"}
    assert shown == {s: str(states.get(s, 0)) for s in shown}
    assert sum(int(n) for n in shown.values()) == 3
    assert guest.submit("peek-messages", {"count": "2"}) == "2 message(s) at the head; none taken."
    assert guest.texts("#got-messages .payload") == ["m0", "m1"]
    question = "Are you sure? 2 message(s) of queue %s are going to be moved to queue %s." % (source, target)
    assert guest.submit("move-messages", {"destination": target, "count": "2"}, confirm=question) == \
        "Moved 2 message(s)."
    counts = {name: api.get("/api/queues/%s/%s" % (segment(vhost), segment(name))).body["messages"]
              for name in (source, target)}
    assert counts == {source: 1, target: 2}


def test_dead_letters_page_shows_the_log_and_replays_a_queue(guest, broker, api, vhost):
    dead, work = unique("ui-dead"), unique("ui-work")
    v = segment(vhost)
    api.put("/api/queues/%s/%s" % (v, dead))
    api.put("/api/queues/%s/%s" % (v, work), {"arguments": {"x-dead-letter-exchange": "",
                                                             "x-dead-letter-routing-key": dead}})
    body = "<b>died</b> " + unique("")
    api.post("/api/exchanges/%s/amq.default/publish" % v, {"routing_key": work, "payload": body,
                                                           "payload_encoding": "string",
                                                           "properties": {"message_id": "m-1"}})
    with pika.BlockingConnection(pika.URLParameters(broker.url.rstrip("/") + "/" + v)) as connection:
        channel = connection.channel()
        method, _props, _body = channel.basic_get(work)
        channel.basic_reject(method.delivery_tag, requeue=False)
    guest.driver.execute_script("sessionStorage.setItem('hutch.vhost', arguments[0])", vhost)
    try:
        guest.open("dead-letters")
        guest.wait_text("#dl-latest", body)
        counts, latest = guest.texts("#dl-counts")[0], guest.texts("#dl-latest")[0]
        assert "rejected" in counts and work in counts
        assert '"message_id": "m-1"' in latest
        assert guest.find("#dl-latest b") == []  # the body is text
        question = "Are you sure? All messages of queue %s are going to be moved to queue %s." % (dead, work)
        assert guest.submit("replay", {"source": dead, "destination": work}, confirm=question) == \
            "Replayed 1 message(s)."
        assert api.get("/api/queues/%s/%s" % (v, work)).body["messages"] == 1
    finally:
        guest.driver.execute_script("sessionStorage.removeItem('hutch.vhost')")


def test_shovel_and_federation_pages_follow_the_api(guest, api):
    for route, path in (("shovels", "/api/shovels"), ("federation", "/api/federation-links")):
        guest.open(route)
        answer = api.get(path)
        if answer.status == 404:
            guest.wait_text("#not-available", "not available on this broker")
        else:
            guest.wait(lambda: guest.find("#links table, #links p.muted"), route)
            assert len(guest.find("#links tbody tr")) == len(answer.body)


def test_the_queue_list_pages(guest, api, vhost):
    v = segment(vhost)
    names = sorted(unique("ui-page") for _ in range(25))
    for name in names:
        api.put("/api/queues/%s/%s" % (v, name))
    guest.open("queues")
    guest.filter("ui-page")
    guest.driver.execute_script("arguments[0].value = '20'; arguments[0].dispatchEvent(new Event('change'))",
                                guest.one("select[name=page_size]"))
    guest.wait_text(".pager", "of 2")
    guest.driver.execute_script("arguments[0].value = '2'; arguments[0].dispatchEvent(new Event('change'))",
                                guest.one("select[name=page]"))
    guest.wait(lambda: guest.texts("#queues tbody a") == names[20:], "the second page")
    guest.one("select[name=page_size]")
    guest.driver.execute_script("arguments[0].value = '100'; arguments[0].dispatchEvent(new Event('change'))",
                                guest.one("select[name=page_size]"))
    guest.filter("")


def test_a_binding_added_and_removed_through_the_queue_page(guest, api, vhost):
    v, name = segment(vhost), unique("ui-bound")
    api.put("/api/queues/%s/%s" % (v, name))
    guest.open("queues/%s/%s" % (v, name))
    assert guest.submit("add-binding", {"source": "amq.direct", "routing_key": "ui.key"}) == "Bound."
    bound = [b for b in api.get("/api/queues/%s/%s/bindings" % (v, name)).body if b["source"] == "amq.direct"]
    assert [b["routing_key"] for b in bound] == ["ui.key"]
    guest.wait(lambda: guest.find(".bindings button.unbind"), "the binding listed")
    guest.wait(lambda: guest.driver.execute_script(
        "const b = document.querySelector('.bindings button.unbind'); if (b) b.click(); return !!b"), "unbind")
    guest.wait(lambda: [b for b in api.get("/api/queues/%s/%s/bindings" % (v, name)).body
                        if b["source"] == "amq.direct"] == [], "the binding gone")


def test_definitions_exported_and_imported_through_the_overview(guest, api, vhost, tmp_path):
    v = segment(vhost)
    kept = unique("ui-kept")
    api.put("/api/queues/%s/%s" % (v, kept))
    guest.driver.execute_script("sessionStorage.setItem('hutch.vhost', arguments[0])", vhost)
    try:
        guest.driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow",
                                                                     "downloadPath": str(tmp_path)})
        guest.open("")
        assert guest.submit("export-definitions").startswith("Exported virtual host")
        download = tmp_path / "hutch_definitions.json"
        exported = guest.wait(lambda: _json_file(download), "the download")
        assert exported == api.get("/api/definitions/" + v).body
        added = unique("ui-imported")
        exported["queues"].append({"name": added, "durable": True, "auto_delete": False, "arguments": {}})
        upload = tmp_path / "definitions.json"
        upload.write_text(json.dumps(exported))
        guest.one("#import-definitions input[name=file]").send_keys(str(upload))
        assert guest.submit("import-definitions") == "Definitions imported."
        assert api.get("/api/queues/%s/%s" % (v, added)).status == 200
    finally:
        guest.driver.execute_script("sessionStorage.removeItem('hutch.vhost')")


def test_policymaker_and_monitoring_views_and_a_user_without_tags_cannot_log_in(ui, api):
    policymaker, monitor, untagged = unique("ui-pm"), unique("ui-mon"), unique("ui-none")
    password = "secret-2"
    api.put("/api/users/" + policymaker, {"password": password, "tags": "policymaker"})
    api.put("/api/permissions/%2F/" + policymaker, ALL_PERMISSIONS)
    api.put("/api/users/" + monitor, {"password": password, "tags": "monitoring"})
    api.put("/api/users/" + untagged, {"password": password, "tags": ""})
    try:
        ui.login(monitor, password)
        ui.wait(lambda: ui.texts("#nodes td")[:1] == [api.get("/api/nodes").body[0]["name"]], "the nodes")
        ui.one("#tab-admin").click()
        ui.wait(lambda: ui.texts("#subnav a") == ["Shovels", "Federation"], "the admin tab with link status only")
        ui.login(policymaker, password)
        ui.one("#tab-admin").click()
        ui.wait(lambda: ui.texts("#subnav a") == ["Policies"], "the admin tab with policies only")
        ui.wait_text("#view h1", "Policies")
        ui.open("vhosts")
        ui.wait_text("#view", "Not authorised")
        ui.login(untagged, password)
        ui.wait_text("#login-error", "Login failed: Not management user")
        assert not ui.one("#app").is_displayed()
    finally:
        for name in (policymaker, monitor, untagged):
            api.delete("/api/users/" + name)


def test_a_vhost_added_and_deleted_through_the_ui_follows_in_the_selector(guest, api):
    name = unique("ui-vh")
    guest.open("vhosts")
    try:
        assert guest.submit("add-vhost", {"name": name, "description": "made in the browser"}) == "Virtual host added."
        assert api.get("/api/vhosts/" + segment(name)).status == 200
        guest.wait(lambda: name in guest.texts("#vhost-select option"), "the new vhost in the selector")
        guest.open("vhosts/" + segment(name))
        guest.submit("delete-vhost", leaves=True, confirm=CONFIRM_DELETE)
        guest.wait(lambda: api.get("/api/vhosts/" + segment(name)).status == 404, "the vhost deleted")
        guest.wait(lambda: name not in guest.texts("#vhost-select option"), "the vhost gone from the selector")
    finally:
        api.delete("/api/vhosts/" + segment(name))


def _facts(ui, css: str) -> dict:
    """The label -> value rows of a facts table."""
    return dict(ui.driver.execute_script("""
        return Array.from(document.querySelectorAll(arguments[0] + ' tr'),
                          r => [r.cells[0].innerText, r.cells[1].innerText])""", css))


def test_a_stream_queue_is_listed_and_shows_its_offsets_and_the_refused_get(guest, broker, api):
    name = unique("ui-stream")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": "stream", "x-max-age": "7D"})
        channel.confirm_delivery()
        for i in range(3):
            channel.basic_publish("", name, b"record %d" % i)
    try:
        shown = wait_for(lambda: (lambda q: q["messages"] == 3 and q)(api.get("/api/queues/%2F/" + name).body), 10)
        log = api.get("/api/hutch/streams/%%2F/%s?limit=0" % name).body
        guest.open("queues")
        guest.filter(name)
        guest.wait(lambda: guest.texts("#queues tbody tr td:nth-child(2)") == [name], "the stream in the list")
        row = guest.texts("#queues tbody tr td")
        assert (row[2], row[8]) == ("stream", "3")
        guest.click_text("#queues tbody a", name)
        guest.wait(lambda: guest.find("#stream-details td"), "the stream's details")
        facts = _facts(guest, "#stream-details")
        assert facts == {"Records kept": "3", "Size": "%d B" % shown["message_bytes"],
                         "First offset": str(log["first_offset"]), "Last offset": str(log["next_offset"] - 1),
                         "Next offset": str(log["next_offset"]), "x-max-age": "7D"}
        assert (log["first_offset"], log["next_offset"]) == (0, 3)
        refusal = guest.submit("get-messages", refused=True)
        assert refusal == "540 basic.get not supported by stream queues queue '%s' in vhost '/'" % name
        assert api.get("/api/queues/%2F/" + name).body["messages"] == 3
        assert guest.submit("peek-messages", {"count": "2"}) == "2 message(s) at the head; none taken."
        assert guest.texts("#got-messages .payload") == ["record 0", "record 1"]
    finally:
        api.delete("/api/queues/%2F/" + name)
        guest.open("queues")
        guest.filter("")


def test_a_shovel_and_a_federation_link_are_shown_as_the_api_reports_them(guest, broker, api, vhost):
    v, upstream = segment(vhost), unique("ui-up")
    source, target, name = unique("ui-shovel-src"), unique("ui-shovel-dst"), unique("ui-shovel")
    uri = "amqp://guest:guest@127.0.0.1:%d/%s" % (broker.port, v)
    api.put("/api/vhosts/" + upstream)
    api.put("/api/permissions/%s/guest" % upstream, ALL_PERMISSIONS)
    try:
        api.put("/api/parameters/shovel/%s/%s" % (v, name), {"value": {
            "src-uri": uri, "src-queue": source, "dest-uri": uri, "dest-queue": target}})
        api.put("/api/exchanges/%s/fx" % upstream, {"type": "topic"})
        api.put("/api/exchanges/%s/fx" % v, {"type": "topic"})
        api.put("/api/parameters/federation-upstream/%s/up" % v, {"value": {
            "uri": "amqp://guest:guest@127.0.0.1:%d/%s" % (broker.port, upstream)}})
        api.put("/api/policies/%s/fed" % v, {"pattern": "^fx$", "definition": {"federation-upstream": "up"}})
        shovel = wait_for(lambda: [s for s in api.get("/api/shovels/" + v).body if s["state"] == "running"], 10)[0]
        guest.open("shovels")
        guest.wait(lambda: name in guest.texts("#links tbody td:first-child"), "the shovel")
        row = next(r for r in _rows(guest, "#links") if r[0] == name)
        assert row[1:4] == [vhost, shovel["type"], shovel["state"]] == [vhost, "dynamic", "running"]
        assert row[4] == shovel["src_uri"] + " queue " + source and row[5] == shovel["dest_uri"] + " queue " + target
        link = wait_for(lambda: [k for k in api.get("/api/federation-links/" + v).body if k["status"] == "running"],
                        10)[0]
        guest.open("federation")
        guest.wait(lambda: vhost in guest.texts("#links tbody td:nth-child(2)"), "the federation link")
        row = next(r for r in _rows(guest, "#links") if r[1] == vhost)
        assert row[:6] == ["up", vhost, "exchange", "fx", link["uri"], "running"]
    finally:
        api.delete("/api/parameters/shovel/%s/%s" % (v, name))
        api.delete("/api/policies/%s/fed" % v)
        api.delete("/api/vhosts/" + upstream)


def _rows(ui, css: str) -> list[list[str]]:
    return ui.driver.execute_script("""
        return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'),
                          r => Array.from(r.cells, c => c.innerText))""", css)


def _chart(ui, index: int) -> dict:
    """The data attributes of the page's `index`th chart (charts.js records
    the x range shown, the number of points and the highest value)."""
    return ui.driver.execute_script("const c = document.querySelectorAll('.chart')[arguments[0]];"
                                    "return c ? Object.assign({}, c.dataset) : {}", index)


def _publish(api, vhost: str, queue: str, count: int) -> None:
    for _ in range(count):
        api.post("/api/exchanges/%s/amq.default/publish" % segment(vhost),
                 {"routing_key": queue, "payload": "x", "payload_encoding": "string", "properties": {}})


def test_charts_show_the_brokers_history_as_the_page_opens(guest, api, vhost):
    v, name = segment(vhost), unique("ui-hist")
    api.put("/api/queues/%s/%s" % (v, name))
    _publish(api, vhost, name, 7)
    ranges = "lengths_age=600&lengths_incr=5"
    wait_for(lambda: api.get("/api/vhosts/%s?%s" % (v, ranges)).body["messages_details"]["samples"][0]["sample"] == 7,
             15, 0.2)
    guest.driver.execute_script("sessionStorage.setItem('hutch.vhost', arguments[0]);"
                                "sessionStorage.removeItem('hutch.chart-range')", vhost)
    try:
        guest.open("")
        queued = guest.wait(lambda: (lambda c: "points" in c and c)(_chart(guest, 0)), "the queued messages chart")
        # the ten minutes before the page opened, in 5 s samples, at the first drawing
        assert queued["points"] == "121" and queued["max"] == "7"
        span = float(queued["to"]) - float(queued["from"])
        assert 595 <= span <= 605, span
        guest.driver.execute_script("const s = document.getElementById('chart-range'); s.value = '3600';"
                                    "s.dispatchEvent(new Event('change'))")
        hour = guest.wait(lambda: (lambda c: c.get("points") == "61" and c)(_chart(guest, 0)), "the last hour")
        assert 3500 <= float(hour["to"]) - float(hour["from"]) <= 3700
        guest.open("queues/%s/%s" % (v, name))
        guest.wait(lambda: _chart(guest, 0).get("points") == "61" and _chart(guest, 0)["max"] == "7",
                   "the queue's hour of history")
    finally:
        guest.driver.execute_script("sessionStorage.removeItem('hutch.vhost');"
                                    "sessionStorage.removeItem('hutch.chart-range')")


def test_exchange_and_channel_pages_chart_their_history_as_they_open(guest, broker, api, vhost):
    v = segment(vhost)
    with pika.BlockingConnection(pika.URLParameters(broker.url.rstrip("/") + "/" + v)) as connection:
        channel = connection.channel()
        channel.exchange_declare("ui-fan", "fanout")
        for queue in ("ui-fan-1", "ui-fan-2"):
            channel.queue_declare(queue)
            channel.queue_bind(queue, "ui-fan")
        for _ in range(5):
            channel.basic_publish("ui-fan", "", b"m")
        ranges = "msg_rates_age=600&msg_rates_incr=5"
        exchange = "/api/exchanges/%s/ui-fan?%s" % (v, ranges)
        # the session broker samples every 5 s: until its history has them in an
        # increment that is over (the charts leave out the newest, not over yet)
        wait_for(lambda: api.get(exchange).body["message_stats"]["publish_out_details"]["samples"][1]["sample"] == 10,
                 20, 0.2, "the exchange's history")
        name = api.get("/api/vhosts/%s/channels" % v).body[0]["name"]
        wait_for(lambda: api.get("/api/channels/%s?%s" % (quote(name, safe=""), ranges)).body["message_stats"][
            "publish_details"]["samples"][1]["sample"] == 5, 20, 0.2, "the channel's history")
        guest.driver.execute_script("sessionStorage.removeItem('hutch.chart-range')")
        for route, heading in (("exchanges/%s/ui-fan" % v, "ui-fan"), ("channels/" + quote(name, safe=""), name)):
            guest.open(route)
            guest.wait_text("#view h1", heading)
            # at its first drawing: ten minutes of 5 s rates (the newest increment, not over, left out),
            # the publishes made before the page opened among them
            chart = guest.wait(lambda: (lambda c: "points" in c and c)(_chart(guest, 0)), "the message rates chart")
            assert int(chart["points"]) in (119, 120) and float(chart["max"]) > 0, (route, chart)
            assert 585 <= float(chart["to"]) - float(chart["from"]) <= 605, (route, chart)
            assert [text for text in guest.texts("#view .error") if text] == []
        labels = guest.driver.execute_script(
            "return Array.from(document.querySelectorAll('.chart .u-legend .u-label'), e => e.textContent)")
        assert labels[1:4] == ["publish", "confirm", "return_unroutable"], labels  # after the time


def test_a_chart_of_one_point_spans_minutes_not_years(guest, broker, api, vhost):
    dead, work = unique("ui-one-dead"), unique("ui-one")
    v = segment(vhost)
    api.put("/api/queues/%s/%s" % (v, dead))
    api.put("/api/queues/%s/%s" % (v, work), {"arguments": {"x-dead-letter-exchange": "",
                                                             "x-dead-letter-routing-key": dead}})
    _publish(api, vhost, work, 1)
    with pika.BlockingConnection(pika.URLParameters(broker.url.rstrip("/") + "/" + v)) as connection:
        channel = connection.channel()
        method, _props, _body = channel.basic_get(work)
        channel.basic_reject(method.delivery_tag, requeue=False)
    guest.driver.execute_script("sessionStorage.setItem('hutch.vhost', arguments[0])", vhost)
    try:
        guest.open("dead-letters")
        chart = guest.wait(lambda: (lambda c: "to" in c and c)(_chart(guest, 0)), "the by-reason chart")
        # one dead letter: one point, on a one-minute axis (1 s buckets) ending at it
        record = api.get("/api/hutch/dead-letters/%s?limit=1" % v).body["records"][0]
        assert float(chart["to"]) - float(chart["from"]) == 60
        assert abs(float(chart["to"]) - record["time"]) <= 1
    finally:
        guest.driver.execute_script("sessionStorage.removeItem('hutch.vhost')")


def test_updating_a_user_keeps_what_was_not_changed(guest, api):
    name = unique("ui-upd")
    api.put("/api/users/" + name, {"password": "old-secret", "tags": "monitoring,policymaker"})
    try:
        guest.open("users/" + name)
        assert guest.one("#update-user-tags").get_attribute("value") == "monitoring, policymaker"
        assert guest.submit("update-user", {"password": "new-secret"}) == "User updated."
        assert sorted(api.get("/api/users/" + name).body["tags"]) == ["monitoring", "policymaker"]
        assert call(api.port, "GET", "/api/whoami", auth=(name, "new-secret")).status == 200
        assert guest.submit("update-user", {"tags": "management"}) == "User updated."
        assert api.get("/api/users/" + name).body["tags"] == ["management"]
        assert call(api.port, "GET", "/api/whoami", auth=(name, "new-secret")).status == 200
    finally:
        api.delete("/api/users/" + name)


def test_an_administrator_changing_its_own_password_stays_an_administrator(ui, api):
    name = unique("ui-admin")
    api.put("/api/users/" + name, {"password": "first-pass", "tags": "administrator"})
    api.put("/api/permissions/%2F/" + name, ALL_PERMISSIONS)
    try:
        ui.login(name, "first-pass")
        ui.one("#tab-admin")
        ui.open("users/" + name)
        assert ui.submit("update-user", {"password": "second-pass"}) == "User updated."
        assert api.get("/api/users/" + name).body["tags"] == ["administrator"]
        # still logged in, with the new password, and still allowed the admin pages
        ui.open("users")
        ui.wait_text("#users", name)
        assert ui.find("#tab-admin") and ui.text("#whoami") == name
        assert call(api.port, "GET", "/api/users", auth=(name, "second-pass")).status == 200
    finally:
        api.delete("/api/users/" + name)
        ui.login("guest", "guest")
        ui.one("#tab-queues")


def test_destructive_actions_ask_first_and_a_no_changes_nothing(guest, api, vhost):
    v, name = segment(vhost), unique("ui-ask")
    path = "/api/queues/%s/%s" % (v, name)
    api.put(path)
    _publish(api, vhost, name, 2)
    guest.open("queues/%s/%s" % (v, name))
    for form_id, question in (("purge", CONFIRM_PURGE), ("delete-queue", CONFIRM_DELETE_QUEUE)):
        guest.one("form#%s button[type=submit]" % form_id).click()
        assert guest.confirmation(accept=False) == question
        assert api.get(path).body["messages"] == 2
    guest.one("form#move-messages input[name=destination]").send_keys("elsewhere")
    guest.one("form#move-messages button[type=submit]").click()
    assert guest.confirmation(accept=False) == \
        "Are you sure? All messages of queue %s are going to be moved to queue elsewhere." % name
    assert api.get(path).body["messages"] == 2
    assert guest.submit("purge", confirm=CONFIRM_PURGE) == "Purged."
    assert api.get(path).body["messages"] == 0
    guest.open("vhosts/" + v)
    guest.one("form#delete-vhost button[type=submit]").click()
    assert guest.confirmation(accept=False) == CONFIRM_DELETE
    assert api.get("/api/vhosts/" + v).status == 200
    exchange = unique("ui-ask-x")
    api.put("/api/exchanges/%s/%s" % (v, exchange), {"type": "fanout"})
    guest.open("exchanges/%s/%s" % (v, exchange))
    guest.one("form#delete-exchange button[type=submit]").click()
    assert guest.confirmation(accept=False) == CONFIRM_DELETE
    assert api.get("/api/exchanges/%s/%s" % (v, exchange)).status == 200


def test_a_page_on_another_site_cannot_use_the_browser_s_credentials(guest, api):
    """Issue 28's attack in a real browser: it has cached an administrator's
    Basic credentials (a visit to /api/...), then a page on another origin
    submits a text/plain form to /api/definitions that would create an
    administrator. hutch refuses it for its Origin (403); nobody is created."""
    evil = unique("evil")
    definitions = json.dumps({"users": [{"name": evil, "password": "x", "tags": "administrator"}], "pad": ""})
    name, value = definitions[:-2], definitions[-2:]  # a text/plain form sends name=value: ..."pad": "="}
    page = ("<html><body><form method='POST' enctype='text/plain' action='%sapi/definitions'>"
            "<input name='%s' value='%s'></form><script>document.forms[0].submit()</script></body></html>"
            % (guest.base, name.replace("'", "&#39;"), value.replace("'", "&#39;")))

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    try:
        host = guest.base.split("//", 1)[1]
        guest.driver.get("http://guest:guest@%sapi/whoami" % host)  # the browser now holds the credentials
        guest.wait(lambda: "guest" in guest.driver.page_source, "whoami with cached credentials")
        guest.driver.get("http://127.0.0.1:%d/" % site.server_address[1])
        guest.wait(lambda: "cross-origin request refused" in guest.driver.page_source, "hutch's 403 to the form")
        assert api.get("/api/users/" + evil).status == 404
    finally:
        site.shutdown()
        site.server_close()
        guest.driver.get(guest.base)
