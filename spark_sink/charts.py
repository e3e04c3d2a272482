"""Inline SVG charts for the HTML report (no scripts, no network: the page
is one self-contained file). Pure functions from numbers to SVG text."""
from __future__ import annotations

from html import escape

PALETTE = {
    "rejected": "#d9534f",
    "expired": "#f0ad4e",
    "maxlen": "#5b8def",
    "delivery_limit": "#8e6bbf",
}
OTHER = ("#4caf93", "#a0785a", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
FONT = 'font-family="system-ui, sans-serif" font-size="12"'


def color(name: str, index: int = 0) -> str:
    return PALETTE.get(name, OTHER[index % len(OTHER)])


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" '
            'aria-label="%s" %s>%s</svg>' % (width, height, width, height, escape(title), FONT, "".join(body)))


def _ticks(maximum: float) -> list[float]:
    """About five round gridline values from 0 to at least `maximum`."""
    if maximum <= 0:
        return [0, 1]
    raw = maximum / 5
    magnitude = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    ticks = [0.0]
    while ticks[-1] < maximum:
        ticks.append(ticks[-1] + step)
    return ticks


def horizontal_bars(items: list[tuple[str, float]], title: str, width: int = 640) -> str:
    """One bar per (label, value), largest scale to the full width."""
    label_w, row_h, value_w = 170, 26, 70
    height = row_h * max(len(items), 1) + 10
    top = max((v for _l, v in items), default=0) or 1
    plot = width - label_w - value_w
    body = []
    for i, (label, value) in enumerate(items):
        y = 5 + i * row_h
        w = plot * value / top
        body.append('<text x="%d" y="%d" text-anchor="end" fill="#333">%s</text>'
                    % (label_w - 8, y + 17, escape(_short(label))))
        body.append('<rect x="%d" y="%d" width="%.1f" height="%d" rx="3" fill="%s"><title>%s: %s</title></rect>'
                    % (label_w, y + 4, w, row_h - 8, color(label, i), escape(label), number(value)))
        body.append('<text x="%.1f" y="%d" fill="#333">%s</text>' % (label_w + w + 6, y + 17, number(value)))
    return _svg(width, height, body, title)


def stacked_columns(labels: list[str], series: dict[str, list[float]], title: str,
                    width: int = 760, height: int = 280) -> str:
    """One column per label, stacked by series (e.g. dead letters per hour by reason)."""
    left, bottom, top_pad, legend_h = 50, 50, 10, 22
    plot_w, plot_h = width - left - 10, height - bottom - top_pad - legend_h
    totals = [sum(values[i] for values in series.values()) for i in range(len(labels))]
    ticks = _ticks(max(totals, default=0))
    scale = plot_h / ticks[-1]
    body = _legend(list(series), left, 14)
    y0 = top_pad + legend_h + plot_h
    for tick in ticks:
        y = y0 - tick * scale
        body.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/>' % (left, width - 10, y, y))
        body.append('<text x="%d" y="%.1f" text-anchor="end" fill="#666">%s</text>' % (left - 6, y + 4, number(tick)))
    slot = plot_w / max(len(labels), 1)
    bar = max(min(slot * 0.7, 60), 2)
    every = max(1, len(labels) // 8)
    for i, label in enumerate(labels):
        x = left + i * slot + (slot - bar) / 2
        y = y0
        for index, (name, values) in enumerate(series.items()):
            h = values[i] * scale
            if h:
                y -= h
                body.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s: %s</title></rect>'
                            % (x, y, bar, h, color(name, index), escape(label), escape(name), number(values[i])))
        if i % every == 0:
            body.append('<text x="%.1f" y="%d" text-anchor="middle" fill="#666">%s</text>'
                        % (x + bar / 2, y0 + 16, escape(_short(label, 16))))
    return _svg(width, height, body, title)


def stacked_bars(labels: list[str], series: dict[str, list[float]], title: str, width: int = 760) -> str:
    """One horizontal bar per label, stacked by series (e.g. reasons per queue)."""
    label_w, row_h, value_w, legend_h = 190, 26, 60, 24
    totals = [sum(values[i] for values in series.values()) for i in range(len(labels))]
    top = max(totals, default=0) or 1
    plot = width - label_w - value_w
    height = legend_h + row_h * max(len(labels), 1) + 6
    body = _legend(list(series), label_w, 14)
    for i, label in enumerate(labels):
        y = legend_h + i * row_h
        body.append('<text x="%d" y="%d" text-anchor="end" fill="#333">%s</text>'
                    % (label_w - 8, y + 17, escape(_short(label))))
        x = float(label_w)
        for index, (name, values) in enumerate(series.items()):
            w = plot * values[i] / top
            if w:
                body.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s, %s: %s</title></rect>'
                            % (x, y + 4, w, row_h - 8, color(name, index), escape(label), escape(name),
                               number(values[i])))
                x += w
        body.append('<text x="%.1f" y="%d" fill="#333">%s</text>' % (x + 6, y + 17, number(totals[i])))
    return _svg(width, height, body, title)


def _legend(names: list[str], x: int, y: int) -> list[str]:
    out = []
    for index, name in enumerate(names):
        out.append('<rect x="%d" y="%d" width="12" height="12" rx="2" fill="%s"/>' % (x, y - 10, color(name, index)))
        out.append('<text x="%d" y="%d" fill="#333">%s</text>' % (x + 16, y, escape(name)))
        x += 28 + 7 * len(name)
    return out


def _short(text: str, limit: int = 26) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def number(value: float) -> str:
    return "%d" % value if float(value).is_integer() else "%.2f" % value
