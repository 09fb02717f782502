"""Small SVG charts drawn on the server: no chart library, no script, nothing inline that
the Content-Security-Policy would block (presentation attributes, not style)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from markupsafe import Markup, escape

COLOURS = {
    "cpu": "#3b6ea5",
    "gpu": "#c4622d",
    "maintenance": "#6b8e23",
    "interactive.cpu": "#7aa6d6",
    "interactive.gpu": "#e8a07a",
}
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 640, 220, 56, 28, 14


def _colour(name: str) -> str:
    return COLOURS.get(name, "#777777")


def _number(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    return f"{value:g}" if value == int(value) else f"{value:.3g}"


def grouped_bars(
    series: Mapping[str, Sequence[float]], ticks: Sequence[str], title: str, unit: str
) -> Markup:
    """One group of bars per tick, one bar per series (e.g. items per 5 minutes by lane)."""
    n = max((len(v) for v in series.values()), default=0)
    top = max((max(v, default=0) for v in series.values()), default=0) or 1
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP
    group_w = plot_w / max(n, 1)
    bar_w = max(1.0, (group_w - 4) / max(len(series), 1))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{escape(title)}" class="chart">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - 8}" y2="{TOP + plot_h}" '
        'stroke="#999"/>',
        f'<text x="{LEFT - 6}" y="{TOP + 10}" text-anchor="end" font-size="11">'
        f"{_number(top)}</text>",
        f'<text x="{LEFT - 6}" y="{TOP + plot_h}" text-anchor="end" font-size="11">0</text>',
        f'<text x="4" y="{TOP + plot_h / 2}" font-size="11">{escape(unit)}</text>',
    ]
    for i in range(n):
        x0 = LEFT + i * group_w + 2
        for j, (name, values) in enumerate(series.items()):
            value = values[i] if i < len(values) else 0
            h = plot_h * value / top
            parts.append(
                f'<rect class="bar" data-series="{escape(name)}" '
                f'x="{x0 + j * bar_w:.1f}" y="{TOP + plot_h - h:.1f}" '
                f'width="{bar_w:.1f}" height="{h:.1f}" fill="{_colour(name)}">'
                f"<title>{escape(name)} {escape(ticks[i] if i < len(ticks) else '')}: "
                f"{_number(value)}</title></rect>"
            )
        if i < len(ticks) and (i % 2 == 0 or i == n - 1):
            parts.append(
                f'<text x="{x0 + group_w / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle" '
                f'font-size="10">{escape(ticks[i])}</text>'
            )
    parts.append(_legend(list(series)))
    parts.append("</svg>")
    return Markup("".join(parts))


def bars(values: Mapping[str, float | None], title: str, fmt: str = "{:.2e}") -> Markup:
    """One horizontal bar per key (e.g. dollars per item by lane); None shows 'no data'."""
    row_h, label_w = 34, 110
    height = TOP + row_h * max(len(values), 1) + 8
    top = max((v for v in values.values() if v), default=0) or 1
    plot_w = WIDTH - label_w - 180
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-label="{escape(title)}" class="chart">',
        f"<title>{escape(title)}</title>",
    ]
    for i, (name, value) in enumerate(values.items()):
        y = TOP + i * row_h
        parts.append(f'<text x="4" y="{y + 18}" font-size="12">{escape(name)}</text>')
        if value is None:
            parts.append(
                f'<text x="{label_w}" y="{y + 18}" font-size="12" fill="#777">'
                "no items in the last hour</text>"
            )
            continue
        w = plot_w * value / top
        parts.append(
            f'<rect class="bar" data-series="{escape(name)}" '
            f'x="{label_w}" y="{y + 4}" width="{w:.1f}" height="20" '
            f'fill="{_colour(name)}"/>'
            f'<text x="{label_w + w + 6:.1f}" y="{y + 18}" font-size="12">'
            f"{escape(fmt.format(value))}</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _legend(names: list[str]) -> str:
    """One swatch and name per series, right-aligned; each as wide as its name."""
    widths = [14 + 7 * len(name) + 12 for name in names]
    x = WIDTH - 8 - sum(widths)
    out = []
    for name, width in zip(names, widths, strict=True):
        out.append(
            f'<rect class="legend" x="{x}" y="2" width="10" height="10" fill="{_colour(name)}"/>'
            f'<text x="{x + 14}" y="11" font-size="11">{escape(name)}</text>'
        )
        x += width
    return "".join(out)
