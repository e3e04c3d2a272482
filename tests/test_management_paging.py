"""Lists as long as the web UI must stay fast with: 10,000 queues and 1,000
connections on a dedicated broker, asked for one page at a time with
RabbitMQ's paging, sorting and name filter; the page is the right slice of
what the whole list holds. (Timings are for bench/management_lists.py.)"""
from __future__ import annotations

import asyncio
import re

import aiormq

from http_api import Api

QUEUES = 10_000
CONNECTIONS = 1_000


def _page(api: Api, path: str, **query) -> dict:
    text = "&".join("%s=%s" % item for item in query.items())
    answer = api.get("%s?%s" % (path, text))
    assert answer.status == 200, answer.body
    return answer.body


def test_a_page_of_ten_thousand_queues_is_the_right_slice(start_broker):
    broker = start_broker(expect=("AMQP", "HTTP"))
    api = Api(broker.ports["HTTP"])
    names = ["q-%05d" % i for i in range(QUEUES)]
    definitions = {"queues": [{"name": n, "vhost": "/", "durable": False, "auto_delete": False, "arguments": {}}
                              for n in reversed(names)]}
    assert api.post("/api/definitions", definitions).status in (201, 204)

    page = _page(api, "/api/queues/%2F", page=7, page_size=100, sort="name")
    assert [q["name"] for q in page["items"]] == names[600:700]
    assert (page["total_count"], page["filtered_count"], page["item_count"], page["page_count"]) == (QUEUES, QUEUES,
                                                                                                     100, 100)
    assert "messages_ready" in page["items"][0] and page["items"][0]["type"] == "classic"

    page = _page(api, "/api/queues", page=1, page_size=20, sort="name", sort_reverse="true")
    assert [q["name"] for q in page["items"]] == names[::-1][:20]

    page = _page(api, "/api/queues/%2F", page=2, page_size=10, name="q-0%5B0-1%5D.5", use_regex="true")
    matching = [n for n in names if re.search(r"q-0[0-1].5", n)]
    assert page["filtered_count"] == len(matching) and page["total_count"] == QUEUES
    assert [q["name"] for q in page["items"]] == matching[10:20]

    page = _page(api, "/api/queues/%2F", page=1, page_size=5, name="Q-0999")  # plain filter: substring, any case
    assert [q["name"] for q in page["items"]] == names[9990:9995] and page["filtered_count"] == 10

    # a sort by another field shapes every queue, and still pages
    page = _page(api, "/api/queues/%2F", page=3, page_size=50, sort="messages", columns="name,messages")
    assert page["item_count"] == 50 and set(page["items"][0]) == {"name", "messages"}

    page = _page(api, "/api/exchanges/%2F", page=1, page_size=3, sort="name")
    assert [x["name"] for x in page["items"]] == ["", "amq.direct", "amq.fanout"]


async def test_a_page_of_a_thousand_connections_is_the_right_slice(start_broker):
    broker = start_broker(expect=("AMQP", "HTTP"))
    api = Api(broker.ports["HTTP"])
    url = "amqp://guest:guest@127.0.0.1:%d/" % broker.port
    opened = []
    try:
        for start in range(0, CONNECTIONS, 100):
            batch = await asyncio.gather(*(aiormq.connect(url) for _ in range(start, min(start + 100, CONNECTIONS))))
            opened += batch
        await asyncio.gather(*(c.channel() for c in opened[:50]))
        everything = await asyncio.to_thread(lambda: api.get("/api/connections").body)
        assert len(everything) == CONNECTIONS
        names = sorted(c["name"] for c in everything)
        page = await asyncio.to_thread(_page, api, "/api/connections", page=4, page_size=100, sort="name")
        assert [c["name"] for c in page["items"]] == names[300:400]
        assert (page["total_count"], page["page_count"]) == (CONNECTIONS, 10)
        page = await asyncio.to_thread(_page, api, "/api/channels", page=2, page_size=20, sort="name")
        assert page["total_count"] == 50 and page["item_count"] == 20
        channel_names = sorted(c["name"] for c in api.get("/api/channels").body)
        assert [c["name"] for c in page["items"]] == channel_names[20:40]
    finally:
        await asyncio.gather(*(c.close() for c in opened), return_exceptions=True)
