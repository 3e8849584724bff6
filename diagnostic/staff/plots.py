"""Small SVG plots for the job page, drawn on the server (no script, nothing external,
so the page's content policy holds): the head node's telemetry through the cold start,
and the cold start's phases as a waterfall."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT, PAD = 560, 120, 32
PHASE_COLOURS = ("#1f5fae", "#1e7a46", "#a05a00", "#6b3fa0", "#b3261e", "#2b7f8f", "#5b6575")


def _reading(sample: Mapping[str, Any], pick: Callable[[Mapping[str, Any]], Any]) -> float | None:
    try:
        value = pick(sample)
    except (KeyError, TypeError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


def telemetry_chart(samples: Sequence[Mapping[str, Any]], title: str,
                    pick: Callable[[Mapping[str, Any]], Any], unit: str) -> SafeString | None:
    points = [(float(s["t"]), v) for s in samples
              if isinstance(s.get("t"), int | float) and (v := _reading(s, pick)) is not None]
    if len(points) < 2:
        return None
    t0, t1 = points[0][0], points[-1][0]
    top = max(v for _, v in points) or 1.0
    span = (t1 - t0) or 1.0
    coords = " ".join(
        f"{PAD + (t - t0) / span * (WIDTH - 2 * PAD):.1f},{HEIGHT - PAD / 2 - v / top * (HEIGHT - PAD):.1f}"
        for t, v in points
    )
    return mark_safe(  # noqa: S308 - every text in it is escaped; the rest is numbers
        f'<svg class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">'
        f'<text x="{PAD}" y="12" class="plot-title">{escape(title)} (peak {top:.1f} {escape(unit)})</text>'
        f'<line x1="{PAD}" y1="{HEIGHT - PAD / 2}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD / 2}" class="axis"/>'
        f'<polyline points="{coords}" class="series"/>'
        f'<text x="{PAD}" y="{HEIGHT - 2}" class="plot-axis">0 s</text>'
        f'<text x="{WIDTH - PAD}" y="{HEIGHT - 2}" text-anchor="end" class="plot-axis">'
        f"{span:.0f} lab s</text>"
        "</svg>"
    )


def telemetry_charts(result: Mapping[str, Any] | None) -> list[SafeString]:
    """The reproduce stage's telemetry of its first node: disk reads, CPU, page cache."""
    telemetry = (result or {}).get("telemetry")
    if not isinstance(telemetry, Mapping) or not telemetry:
        return []
    node = sorted(telemetry)[0]
    samples = telemetry[node]
    if not isinstance(samples, Sequence):
        return []
    charts = [
        telemetry_chart(samples, f"{node}: disk read", lambda s: s["disk_read_mbps"], "MB/s"),
        telemetry_chart(samples, f"{node}: CPU busy", lambda s: 100.0 - s["cpu"]["idle"], "%"),
        telemetry_chart(samples, f"{node}: page cache", lambda s: s["mem"]["cached_kib"] / 1048576, "GiB"),
    ]
    return [c for c in charts if c is not None]


RUN_WORDS = {"before": "the customer's configuration", "after": "with the proved changes"}


def cold_start_waterfall(cold_start: Mapping[str, Any] | None) -> SafeString | None:
    """The cold start's phases on the head node (the first node the phases name), as bars
    along lab seconds: the customer's configuration and, when the triage proved changes,
    the start with them, one above the other on the same scale so the saving is seen."""
    phases = [p for p in (cold_start or {}).get("phases") or [] if isinstance(p, Mapping)]
    if not phases:
        return None
    node = str(phases[0].get("node"))
    runs: dict[str, list[Mapping[str, Any]]] = {}
    for p in phases:
        if str(p.get("node")) == node:
            runs.setdefault(str(p.get("run")), []).append(p)
    end = max(float(p.get("end_s") or 0) for mine in runs.values() for p in mine) or 1.0
    row_h, left, right = 18, 130, 56
    scale = (WIDTH - left - right) / end
    parts: list[str] = []
    y = 22
    for run, mine in runs.items():
        total = max(float(p.get("end_s") or 0) for p in mine)
        parts.append(f'<text x="4" y="{y + 10}" class="plot-title">{escape(RUN_WORDS.get(run, run))}: '
                     f"{total:.0f} lab s</text>")
        y += 16
        for i, p in enumerate(mine):
            start, stop = float(p.get("start_s") or 0), float(p.get("end_s") or 0)
            x, w = left + start * scale, max(2.0, (stop - start) * scale)
            colour = PHASE_COLOURS[i % len(PHASE_COLOURS)]
            parts.append(
                f'<text x="{left - 6}" y="{y + 11}" text-anchor="end" class="plot-axis">'
                f'{escape(str(p.get("phase") or "").replace("_", " "))}</text>'
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 5}" fill="{colour}"/>'
                f'<text x="{x + w + 4:.1f}" y="{y + 11}" class="plot-axis">{stop - start:.0f} s</text>'
            )
            y += row_h
        y += 8
    axis_y = y
    parts.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + end * scale:.1f}" y2="{axis_y}" class="axis"/>'
                 f'<text x="{left}" y="{axis_y + 12}" class="plot-axis">0</text>'
                 f'<text x="{left + end * scale:.1f}" y="{axis_y + 12}" text-anchor="end" class="plot-axis">'
                 f"{end:.0f} lab s</text>")
    title = f"Cold start phases on {escape(node)}"
    return mark_safe(  # noqa: S308 - every text in it is escaped; the rest is numbers
        f'<svg class="plot" viewBox="0 0 {WIDTH} {axis_y + 18}" role="img" aria-label="{title}">'
        f'<text x="4" y="12" class="plot-title">{title}</text>{"".join(parts)}</svg>'
    )
