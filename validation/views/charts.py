"""Validation rounds of a milestone as a small inline SVG, drawn by the server.

One bar per finished validator run (a "round"), oldest on the left; the bar stacks the
run's assertion verdicts: passed (bottom), failed, blocked. A run without per-assertion
verdicts (an error) is a short grey bar. Every bar links to its run and has a title, and
the chart's title sums it up, so nothing is said by colour alone.
"""

from __future__ import annotations

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 360, 96
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 22, 6, 6, 18
SEGMENTS = (("pass", "passed"), ("fail", "failed"), ("blocked", "blocked"))


def _n(value: float) -> str:
    # format_html escapes its arguments into strings first: numbers are formatted here.
    return f"{value:.1f}"


def _when(value) -> str:
    if value is None:
        return ""
    return timezone.localtime(value).strftime("%d %b %H:%M")


def _bar(r: dict, x: float, width: float, scale: float, baseline: float) -> str:
    parts, y = [], baseline
    total = r["pass"] + r["fail"] + r["blocked"]
    if total == 0:
        parts.append(
            format_html(
                '<rect class="seg-error" x="{}" y="{}" width="{}" height="6"></rect>',
                _n(x),
                _n(baseline - 6),
                _n(width),
            )
        )
    for key, _name in SEGMENTS:
        if r[key]:
            h = r[key] * scale
            y -= h
            parts.append(
                format_html(
                    '<rect class="seg-{}" x="{}" y="{}" width="{}" height="{}"></rect>',
                    key,
                    _n(x),
                    _n(y),
                    _n(width),
                    _n(h),
                )
            )
    what = f"{r['feature']}" if r.get("feature") else "milestone run"
    title = (
        f"Run {r['run']} ({what}): {r['status']} — {r['pass']} passed, {r['fail']} failed, "
        f"{r['blocked']} blocked{', ' + _when(r['at']) if r['at'] else ''}"
    )
    return format_html(
        '<a href="/runs/{}/" class="round round--{}"><title>{}</title>{}</a>',
        r["run"],
        r["status"],
        title,
        mark_safe("".join(parts)),
    )


def rounds_svg(rounds: list[dict], *, chart_id: str, name: str) -> SafeString:
    statuses = {s: sum(1 for r in rounds if r["status"] == s) for s in ("passed", "failed", "blocked", "error")}
    summary = f"Validation rounds of {name}: {len(rounds)} round{'s' if len(rounds) != 1 else ''}" + "".join(
        f", {n} {s}" for s, n in statuses.items() if n
    )
    if not rounds:
        return format_html('<p class="chart-empty" id="{}">No validation rounds yet.</p>', chart_id)
    inner_w = WIDTH - PAD_LEFT - PAD_RIGHT
    baseline = HEIGHT - PAD_BOTTOM
    top = max(max(r["pass"] + r["fail"] + r["blocked"] for r in rounds), 1)
    scale = (baseline - PAD_TOP) / top
    step = inner_w / max(len(rounds), 1)
    width = max(min(step * 0.7, 18), 2)
    bars = mark_safe(
        "".join(_bar(r, PAD_LEFT + i * step + (step - width) / 2, width, scale, baseline) for i, r in enumerate(rounds))
    )
    axis = format_html(
        '<line class="axis" x1="{}" y1="{}" x2="{}" y2="{}"></line>'
        '<text class="tick" x="{}" y="{}" text-anchor="end">{}</text>'
        '<text class="tick" x="{}" y="{}" text-anchor="end">0</text>'
        '<text class="tick" x="{}" y="{}">{}</text>'
        '<text class="tick" x="{}" y="{}" text-anchor="end">{}</text>',
        PAD_LEFT,
        baseline,
        WIDTH - PAD_RIGHT,
        baseline,
        PAD_LEFT - 4,
        PAD_TOP + 8,
        top,
        PAD_LEFT - 4,
        baseline,
        PAD_LEFT,
        HEIGHT - 4,
        _when(rounds[0]["at"]),
        WIDTH - PAD_RIGHT,
        HEIGHT - 4,
        _when(rounds[-1]["at"]) if len(rounds) > 1 else "",
    )
    return format_html(
        '<svg class="rounds" id="{id}" viewBox="0 0 {w} {h}" role="img" aria-labelledby="{id}-title" '
        'preserveAspectRatio="xMinYMid meet"><title id="{id}-title">{summary}</title>{axis}{bars}</svg>',
        id=chart_id,
        w=WIDTH,
        h=HEIGHT,
        summary=summary,
        axis=axis,
        bars=bars,
    )


def legend() -> SafeString:
    items = format_html_join(
        "",
        '<li><span class="swatch seg-{}" aria-hidden="true"></span>{}</li>',
        [(k, n) for k, n in SEGMENTS] + [("error", "error (no verdict)")],
    )
    return format_html('<ul class="legend" aria-label="Chart legend">{}</ul>', items)
