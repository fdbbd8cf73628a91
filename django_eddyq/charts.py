"""Line charts of activity series as inline SVG, drawn on the server: no JavaScript, no CDN.

Each line differs from the others by more than its colour: its dash pattern and its marker
(circle, square, triangle, diamond), repeated in the legend next to its name. The chart is an
image with a title and a description that says what it shows in words (``role="img"``,
``aria-labelledby``); the page puts the same numbers in a table beside it. Every text is
escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from django_eddyq.activity import Series

WIDTH = 720
HEIGHT = 240
# Room around the plot for the axes' labels, and below it for the legend.
LEFT, RIGHT, TOP, BOTTOM, LEGEND = 56, 16, 12, 28, 26
#: At most this many markers on a line: more would cover it.
MARKERS = 24


@dataclass(frozen=True)
class Line:
    """One line: its name (shown in the legend), its values (None: a gap), and its look."""

    name: str
    values: Sequence[int | None]
    css_class: str  # sets its colour, in admin.css
    dash: str  # an SVG stroke-dasharray, "" for a solid line
    marker: str  # "circle", "square", "triangle" or "diamond"


def line_chart(
    lines: Sequence[Line],
    starts: Sequence[datetime],
    *,
    chart_id: str,
    title: str,
    description: str,
    label_every: int,
    label_format: str,
) -> SafeString:
    """An SVG chart of ``lines`` over the buckets beginning at ``starts``; the x axis labels
    every ``label_every``-th bucket with ``label_format`` (strftime, in the current time
    zone). ``chart_id`` makes the ids of its title and description unique on the page."""
    plot_width = WIDTH - LEFT - RIGHT
    plot_height = HEIGHT - TOP - BOTTOM - LEGEND
    count = max(len(starts), 1)
    top = nice_ceiling(max((v for line in lines for v in line.values if v is not None), default=0))

    def x(index: int) -> float:
        return LEFT + (plot_width * index / (count - 1) if count > 1 else plot_width / 2)

    def y(value: int) -> float:
        return TOP + plot_height * (1 - value / top)

    ids = f"{chart_id}-title {chart_id}-desc"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="eddyq-chart" id="{escape(chart_id)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-labelledby="{escape(ids)}">',
        f'<title id="{escape(chart_id)}-title">{escape(title)}</title>',
        f'<desc id="{escape(chart_id)}-desc">{escape(description)}</desc>',
        '<g class="eddyq-chart-axes" aria-hidden="true">',
    ]
    for tick in (0, top // 2, top) if top > 1 else (0, top):
        parts.append(
            f'<line class="eddyq-chart-grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" '
            f'y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
            f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:,}</text>'
        )
    for index in range(0, len(starts), max(label_every, 1)):
        label = timezone.localtime(starts[index]).strftime(label_format)
        parts.append(
            f'<line class="eddyq-chart-tick" x1="{x(index):.1f}" x2="{x(index):.1f}" '
            f'y1="{TOP + plot_height}" y2="{TOP + plot_height + 4}"/>'
            f'<text x="{x(index):.1f}" y="{TOP + plot_height + 16}" text-anchor="middle">'
            f"{escape(label)}</text>"
        )
    parts.append("</g>")
    for number, line in enumerate(lines):
        parts.append(f'<g class="eddyq-chart-line {escape(line.css_class)}" aria-hidden="true">')
        for segment in _segments(line.values):
            points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in segment)
            dash = f' stroke-dasharray="{escape(line.dash)}"' if line.dash else ""
            parts.append(f'<polyline fill="none" points="{points}"{dash}/>')
        # Markers on every step-th point, each line's shifted, so that they do not overlap;
        # and on a point alone between gaps, which no line shows.
        step = max(1, math.ceil(count / MARKERS))
        marked = set(range(number * step // max(len(lines), 1), len(line.values), step))
        marked |= {segment[0][0] for segment in _segments(line.values) if len(segment) == 1}
        for index in sorted(marked):
            value = line.values[index]
            if value is not None:
                parts.append(_marker(line.marker, x(index), y(value)))
        parts.append("</g>")
    parts.append(_legend(lines))
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text above is escaped


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 times a power of ten (at least 1) that is at least ``value``:
    the top of the y axis."""
    if value <= 1:
        return 1
    power: int = 10 ** (len(str(int(value))) - 1)
    for factor in (1, 2, 5, 10):
        if factor * power >= value:
            return factor * power
    raise AssertionError("unreachable: 10 * power exceeds value")


def _segments(values: Sequence[int | None]) -> list[list[tuple[int, int]]]:
    """The runs of consecutive values that are not None: a gap breaks the line."""
    segments: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    for index, value in enumerate(values):
        if value is None:
            if current:
                segments.append(current)
            current = []
        else:
            current.append((index, value))
    if current:
        segments.append(current)
    return segments


def _marker(shape: str, x: float, y: float, size: float = 3.5) -> str:
    if shape == "square":
        side = 2 * size
        return f'<rect x="{x - size:.1f}" y="{y - size:.1f}" width="{side}" height="{side}"/>'
    if shape == "triangle":
        return (
            f'<polygon points="{x:.1f},{y - size - 1:.1f} {x - size - 0.5:.1f},{y + size:.1f} '
            f'{x + size + 0.5:.1f},{y + size:.1f}"/>'
        )
    if shape == "diamond":
        return (
            f'<polygon points="{x:.1f},{y - size - 1:.1f} {x + size + 1:.1f},{y:.1f} '
            f'{x:.1f},{y + size + 1:.1f} {x - size - 1:.1f},{y:.1f}"/>'
        )
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{size}"/>'


def _legend(lines: Sequence[Line]) -> str:
    """Each line's sample (its dash and marker) and its name, in a row below the plot."""
    parts = ['<g class="eddyq-chart-legend">']
    left = float(LEFT)
    baseline = HEIGHT - 8
    for line in lines:
        dash = f' stroke-dasharray="{escape(line.dash)}"' if line.dash else ""
        parts.append(
            f'<g class="eddyq-chart-line {escape(line.css_class)}">'
            f'<line x1="{left:.1f}" x2="{left + 28:.1f}" y1="{baseline - 4}" '
            f'y2="{baseline - 4}"{dash}/>{_marker(line.marker, left + 14, baseline - 4)}</g>'
            f'<text x="{left + 34:.1f}" y="{baseline}">{escape(line.name)}</text>'
        )
        left += 48 + 7.5 * len(line.name)
    parts.append("</g>")
    return "".join(parts)


# The activity page's charts.


@dataclass(frozen=True)
class ActivityCharts:
    """A series drawn: its finished jobs and its queue depth, each a chart."""

    series: Series
    heading: str
    finished: SafeString
    depth: SafeString


def activity_charts(
    series: Series, *, chart_id: str, heading: str, label_every: int, label_format: str
) -> ActivityCharts:
    """The charts of ``series``: jobs completed, failed and retried per bucket; the depth."""
    starts = [bucket.start for bucket in series.buckets]
    totals = series.totals
    scope = _("queue %(queue)s") % {"queue": series.queue} if series.queue else _("all queues")
    finished = [
        Line(
            str(_("completed")),
            [b.completed for b in series.buckets],
            "eddyq-line-completed",
            "",
            "circle",
        ),
        Line(
            str(_("failed")),
            [b.failed for b in series.buckets],
            "eddyq-line-failed",
            "6 3",
            "square",
        ),
        Line(
            str(_("retried")),
            [b.retried for b in series.buckets],
            "eddyq-line-retried",
            "2 3",
            "triangle",
        ),
    ]
    busiest = max(series.buckets, key=lambda b: b.completed + b.failed + b.retried, default=None)
    described = _(
        "%(heading)s, %(scope)s: %(completed)s completed, %(failed)s failed, %(retried)s retried."
    ) % {
        "heading": heading,
        "scope": scope,
        "completed": f"{totals['completed']:,}",
        "failed": f"{totals['failed']:,}",
        "retried": f"{totals['retried']:,}",
    }
    if busiest is not None and busiest.completed + busiest.failed + busiest.retried:
        described += " " + _("Busiest: %(when)s, %(jobs)s jobs.") % {
            "when": timezone.localtime(busiest.start).strftime(label_format),
            "jobs": f"{busiest.completed + busiest.failed + busiest.retried:,}",
        }
    depths = [b.available for b in series.buckets]
    sampled = [depth for depth in depths if depth is not None]
    if sampled:
        depth_described = _(
            "%(heading)s, %(scope)s: available jobs between %(low)s and %(high)s, "
            "%(last)s at the latest sample."
        ) % {
            "heading": heading,
            "scope": scope,
            "low": f"{min(sampled):,}",
            "high": f"{max(sampled):,}",
            "last": f"{sampled[-1]:,}",
        }
    else:
        depth_described = _("%(heading)s, %(scope)s: no sample of the queues' depth.") % {
            "heading": heading,
            "scope": scope,
        }
    return ActivityCharts(
        series=series,
        heading=heading,
        finished=line_chart(
            finished,
            starts,
            chart_id=f"{chart_id}-finished",
            title=str(_("Jobs finished, %(heading)s") % {"heading": heading}),
            description=str(described),
            label_every=label_every,
            label_format=label_format,
        ),
        depth=line_chart(
            [Line(str(_("available jobs")), depths, "eddyq-line-depth", "8 3 2 3", "diamond")],
            starts,
            chart_id=f"{chart_id}-depth",
            title=str(_("Queue depth, %(heading)s") % {"heading": heading}),
            description=str(depth_described),
            label_every=label_every,
            label_format=label_format,
        ),
    )


# A workflow's graph: its steps as boxes in columns by depth (a step one column right of the
# deepest step it depends on), its dependencies as lines from left to right.
NODE_WIDTH, NODE_HEIGHT, COLUMN_GAP, ROW_GAP, MARGIN = 150, 26, 40, 10, 8
#: A step's name is cut to this many characters in its box (the whole name is its tooltip).
NODE_LABEL = 20


def workflow_graph(steps: Sequence[GraphStep], title: str) -> SafeString:
    """The steps and their dependencies (only among ``steps``) as an inline SVG image."""
    depth: dict[int, int] = {}
    for step in steps:  # in the order added: a step's dependencies come before it
        depth[step.job_id] = 1 + max((depth.get(up, -1) for up in step.after), default=-1)
    columns: dict[int, list[GraphStep]] = {}
    for step in steps:
        columns.setdefault(depth[step.job_id], []).append(step)
    place: dict[int, tuple[float, float]] = {}
    for column, members in columns.items():
        for row, step in enumerate(members):
            place[step.job_id] = (
                MARGIN + column * (NODE_WIDTH + COLUMN_GAP),
                MARGIN + row * (NODE_HEIGHT + ROW_GAP),
            )
    width = MARGIN * 2 + len(columns) * (NODE_WIDTH + COLUMN_GAP) - COLUMN_GAP
    rows = max((len(members) for members in columns.values()), default=0)
    height = MARGIN * 2 + rows * (NODE_HEIGHT + ROW_GAP) - ROW_GAP
    middle = NODE_HEIGHT / 2
    edges = []
    for step in steps:
        x2, y2 = place[step.job_id]
        for up in step.after:
            if up in place:
                x1, y1 = place[up]
                edges.append(
                    f'<line class="eddyq-graph-edge" x1="{x1 + NODE_WIDTH:.0f}" '
                    f'y1="{y1 + middle:.0f}" x2="{x2:.0f}" y2="{y2 + middle:.0f}"/>'
                )
    nodes = []
    for step in steps:
        x, y = place[step.job_id]
        label = step.name if len(step.name) <= NODE_LABEL else step.name[: NODE_LABEL - 1] + "…"
        nodes.append(
            f'<a href="{escape(step.url)}">'
            f'<g class="eddyq-graph-node eddyq-state-{escape(step.state)}">'
            f"<title>{escape(step.name)}: {escape(step.state)}</title>"
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{NODE_WIDTH}" height="{NODE_HEIGHT}" rx="5"/>'
            f'<text x="{x + 8:.0f}" y="{y + middle + 4:.0f}">{escape(label)}</text></g></a>'
        )
    description = _(
        "%(steps)d steps in %(columns)d columns, each after the steps it depends on"
    ) % {"steps": len(steps), "columns": len(columns)}
    return mark_safe(  # every text above is escaped
        f'<svg class="eddyq-graph" role="img" aria-labelledby="eddyq-graph-title eddyq-graph-desc"'
        f' width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<title id="eddyq-graph-title">{escape(title)}</title>'
        f'<desc id="eddyq-graph-desc">{escape(description)}</desc>'
        f"{''.join(edges)}{''.join(nodes)}</svg>"
    )


@dataclass(frozen=True)
class GraphStep:
    """A step as the graph draws it."""

    job_id: int
    name: str
    state: str
    url: str
    after: tuple[int, ...]
