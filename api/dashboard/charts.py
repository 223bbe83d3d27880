"""Charts as server-rendered SVG: nothing to download, nothing from a CDN, no script.

The page's Content-Security-Policy forbids inline ``style``, so every colour is an SVG
presentation attribute (``fill``), which CSP does not govern. Each chart has a ``<title>``
per mark (hover text) and an ``aria-label`` with the whole picture in words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta

from markupsafe import Markup

from verimail.api.dashboard.labels import status_label
from verimail.schemas.status_groups import STATUSES, groups

COLOURS = {
    "valid": "#1a7f37",
    "likely_valid": "#4ac26b",
    "catchall": "#d4a72c",
    "risky": "#e16f24",
    "unknown": "#8c959f",
    "disposable": "#8250df",
    "invalid": "#cf222e",
    # finder
    "found": "#1a7f37",
    "catch_all": "#d4a72c",
    "not_found": "#8c959f",
    "invalid_input": "#cf222e",
}
ORDER = STATUSES


@dataclass(frozen=True)
class Slice:
    """One part of a breakdown: its key (a status), its words and its count."""

    key: str
    label: str
    count: int


def job_slices(view: dict[str, int]) -> list[Slice]:
    """A bulk job's counts (the API's fields) as one slice per status group, in
    :data:`ORDER` (``schemas/status_groups.py``: the page's list shows the same)."""
    return [Slice(key, status_label(key), count) for key, count in groups(view).items()]


def finder_slices(view: dict[str, int]) -> list[Slice]:
    keys = ("found", "catch_all", "not_found", "invalid_input")
    return [Slice(k, status_label(k), view.get(f"{k}_count", 0)) for k in keys]


def _share(count: int, total: int) -> str:
    return f"{100 * count / total:.1f} %" if total else "0 %"


def breakdown(slices: Sequence[Slice], *, title: str) -> Markup:
    """A full-width stacked bar of ``slices`` and its legend (counts and shares)."""
    total = sum(s.count for s in slices)
    words = ", ".join(f"{s.label} {s.count:,}" for s in slices if s.count) or "no results yet"
    parts = [
        Markup(
            '<figure class="chart breakdown"><figcaption>{}</figcaption>'
            '<svg viewBox="0 0 1000 40" preserveAspectRatio="none" width="100%" height="40" '
            'role="img" aria-label="{}: {}">'
        ).format(title, title, words)
    ]
    if not total:
        parts.append(Markup('<rect x="0" y="0" width="1000" height="40" fill="#eaeef2"/>'))
    x = 0.0
    for s in slices:
        if not s.count:
            continue
        width = 1000 * s.count / total
        parts.append(
            Markup(
                '<rect x="{:.2f}" y="0" width="{:.2f}" height="40" fill="{}" data-status="{}">'
                "<title>{}: {:,} ({})</title></rect>"
            ).format(
                x,
                width,
                COLOURS.get(s.key, "#8c959f"),
                s.key,
                s.label,
                s.count,
                _share(s.count, total),
            )
        )
        x += width
    parts.append(Markup('</svg><ul class="legend">'))
    for s in slices:
        parts.append(
            Markup(
                '<li data-status="{}"><svg width="12" height="12" aria-hidden="true">'
                '<rect width="12" height="12" rx="2" fill="{}"/></svg> {} '
                "<strong>{:,}</strong> <small>{}</small></li>"
            ).format(s.key, COLOURS.get(s.key, "#8c959f"), s.label, s.count, _share(s.count, total))
        )
    parts.append(Markup("</ul></figure>"))
    return Markup("").join(parts)


def daily_bars(values: Sequence[int], last_day: date, *, title: str) -> Markup:
    """Vertical bars, one per day ending ``last_day``, with the busiest day's figure and
    the first and last dates as axis labels."""
    n = len(values)
    top = max(values, default=0)
    first_day = last_day - timedelta(days=n - 1)
    spent = sum(values)
    words = f"{spent:,} credits over {n} days, at most {top:,} in a day"
    width, height, base = 1000, 160, 140
    step = width / max(n, 1)
    parts = [
        Markup(
            '<figure class="chart daily"><figcaption>{}</figcaption>'
            '<svg viewBox="0 0 {} {}" width="100%" height="{}" role="img" aria-label="{}: {}">'
            '<line x1="0" y1="{}" x2="{}" y2="{}" stroke="#d9dee4"/>'
        ).format(title, width, height, height, title, words, base, width, base)
    ]
    for i, value in enumerate(values):
        day = first_day + timedelta(days=i)
        h = 0 if not top else (base - 20) * value / top
        parts.append(
            Markup(
                '<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="#1f6feb" '
                'data-day="{}" data-value="{}"><title>{}: {:,} credits</title></rect>'
            ).format(
                i * step + step * 0.15,
                base - h,
                step * 0.7,
                h,
                day.isoformat(),
                value,
                day.isoformat(),
                value,
            )
        )
    parts.append(
        Markup(
            '<text x="0" y="{}" font-size="13" fill="#5b6673">{}</text>'
            '<text x="{}" y="{}" font-size="13" fill="#5b6673" text-anchor="end">{}</text>'
            '<text x="0" y="12" font-size="13" fill="#5b6673">max {:,}/day</text>'
            "</svg></figure>"
        ).format(height - 4, first_day.isoformat(), width, height - 4, last_day.isoformat(), top)
    )
    return Markup("").join(parts)
