"""bench/growth.py's charts (pure logic; the benchmark itself is not a test): one SVG per
dimension measured, a line and a point per broker and measurement, log-scaled x."""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from growth import _label, _ticks, render  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def test_ticks_are_round_and_cover_the_range():
    assert _ticks(0, 9.5) == [0, 2, 4, 6, 8]
    assert _ticks(0, 250_000) == [0, 50_000, 100_000, 150_000, 200_000, 250_000]


def test_labels_are_short():
    assert _label(250_000) == "250k"
    assert _label(4 << 20, binary=True) == "4Mi"
    assert _label(16) == "16"


def test_render_draws_each_broker_in_both_panels(tmp_path):
    results = {"dimensions": {"size": {
        "hutch": [{"x": 16, "consumed": 100_000.0, "cpu_us": 5.0}, {"x": 65536, "consumed": 10_000.0, "cpu_us": 50.0}],
        "RabbitMQ": [{"x": 16, "consumed": 40_000.0, "cpu_us": 25.0}, {"x": 65536, "skipped": "socket limit"}],
    }}}
    written = render(results, str(tmp_path))
    assert written == [str(tmp_path / "size.svg")]
    root = ET.parse(written[0]).getroot()
    lines = root.findall(SVG + "polyline")
    assert len(lines) == 4  # two brokers, two panels
    assert len(root.findall(SVG + "circle")) == 2 + 1 + 2 + 1  # the skipped point is not drawn
    xs = [float(p.split(",")[0]) for p in lines[0].get("points").split()]
    assert xs == sorted(xs) and xs[0] < xs[1]
    texts = [t.text for t in root.iter(SVG + "text")]
    assert "64Ki" in texts and "hutch" in texts and "RabbitMQ" in texts
