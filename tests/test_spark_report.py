"""The HTML report and its SVG charts as pure functions (no Spark): what
goes in is escaped, every reason gets its colour, axes get round ticks,
and an empty log still renders a page that says so."""
from __future__ import annotations

import datetime
import xml.etree.ElementTree as ET

from spark_sink import charts, report

T0 = datetime.datetime(2026, 1, 2, 10, 0)


def data(**kw) -> report.ReportData:
    base = dict(title="DL <test>", source="http://broker:15672 vhost /", total=3, first_offset=0, last_offset=2,
                first_time=T0, last_time=T0 + datetime.timedelta(minutes=5), window="1 minute",
                reasons=[("rejected", 2, 66.7), ("expired", 1, 33.3), ("maxlen", 0, 0.0), ("delivery_limit", 0, 0.0)],
                timeline=[(T0, "rejected", 2), (T0 + datetime.timedelta(minutes=1), "expired", 1)],
                queues=[{"vhost": "/", "queue": "<script>q</script>", "rejected": 2, "expired": 1, "maxlen": 0,
                         "delivery_limit": 0, "total": 3, "share": 100.0}],
                top_queues=[{"vhost": "/", "queue": "<script>q</script>", "count": 3, "main_reason": "rejected",
                             "first": T0, "last": T0, "bytes": 30}],
                delivery_counts=[{"reason": "rejected", "count": 2, "min_deaths": 1, "avg_deaths": 1.0, "max_deaths": 1,
                                  "p95_deaths": 1, "avg_delivery_count": 0.0, "max_delivery_count": 0}],
                death_histogram=[(1, 3)],
                samples=[{"reason": "rejected", "offset": 0, "time": T0, "queue": "q", "exchange": "",
                          "routing_keys": "q", "message_id": None, "death_count": 1, "body_size": 9,
                          "body_preview": "<b>hi</b>"}])
    base.update(kw)
    return report.ReportData(**base)


def test_everything_a_client_chose_is_escaped():
    page = report.render(data())
    assert "<script>" not in page and "&lt;script&gt;q&lt;/script&gt;" in page
    assert "<b>hi</b>" not in page and "<code>&lt;b&gt;hi&lt;/b&gt;</code>" in page
    assert "<title>DL &lt;test&gt;</title>" in page


def test_every_chart_is_well_formed_svg_with_one_colour_per_reason():
    page = report.render(data())
    svgs = page.split("<svg")[1:]
    assert len(svgs) == 4
    for chunk in svgs:
        ET.fromstring("<svg" + chunk.split("</svg>")[0] + "</svg>")
    assert charts.PALETTE["rejected"] in svgs[0] and charts.PALETTE["expired"] in svgs[0]
    assert ">10:00<" in svgs[1] and ">10:01<" in svgs[1]  # one day: times without the date


def test_ticks_are_round_and_cover_the_maximum():
    assert charts._ticks(7) == [0, 2, 4, 6, 8]
    assert charts._ticks(1234)[-1] >= 1234 and charts._ticks(1234)[1] == 500
    assert charts._ticks(0) == [0, 1]


def test_an_empty_log_renders_a_page_that_says_so():
    page = report.render(data(total=0, first_offset=None, last_offset=None, first_time=None, last_time=None,
                              reasons=[(r, 0, 0.0) for r in ("rejected", "expired", "maxlen", "delivery_limit")],
                              timeline=[], queues=[], top_queues=[], delivery_counts=[], death_histogram=[],
                              samples=[]))
    assert page.count("No dead letters.") == 5
    assert '<div class="card"><b>0</b><span>dead letters</span></div>' in page
