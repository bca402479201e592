"""Shared pieces of the dashboard views: fragment responses, the live stream a page
follows, and the short texts that describe checks, events and durations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_safe
from django_eventstream import get_current_event_id

from missions.delivery import mission_channel

FRAGMENT_HEADER = "X-Fusion-Fragment"


def fragment(request, template: str, context: dict[str, Any]):
    """One region of a page, re-rendered for a live update. The header tells the page's
    script that this is a fragment (and not, say, the login page after a redirect)."""
    response = render(request, template, context)
    response[FRAGMENT_HEADER] = "1"
    add_never_cache_headers(response)
    return response


Parts = dict[str, tuple[str, Callable[[Any], dict[str, Any]]]]


def object_pages(
    *, noun: str, template: str, parts: Parts, load: Callable[[HttpRequest, int], Any], mission_of: Callable[[int], int]
) -> tuple[Callable[..., HttpResponse], Callable[..., HttpResponse]]:
    """The page of one object (`…/<pk>/`) and each of its regions (`…/<pk>/_/<part>/`),
    built from one table of parts: {part: (fragment template, context builder)}. The page
    renders every part; a live update re-renders one. The stream position is taken
    before any read, so later changes are replayed to the page."""

    @login_required
    @require_safe
    def detail(request: HttpRequest, pk: int) -> HttpResponse:
        stream = mission_live(mission_of(pk))
        obj = load(request, pk)
        context = {**stream, noun: obj, "mission": obj.mission}
        for _template, build in parts.values():
            context.update(build(obj))
        return render(request, template, context)

    @login_required
    @require_safe
    def part(request: HttpRequest, pk: int, part: str) -> HttpResponse:
        if part not in parts:
            raise Http404("no such part")
        obj = load(request, pk)
        part_template, build = parts[part]
        return fragment(request, part_template, {noun: obj, "mission": obj.mission, **build(obj)})

    return detail, part


def live(channels: set[str], stream_url: str) -> dict[str, str]:
    """The stream a page follows and the event id it was rendered at. Taken *before* the
    page reads its data: whatever happens after is replayed to the page when it connects."""
    return {"stream_url": stream_url, "last_event_id": get_current_event_id(sorted(channels))}


def mission_live(mission_id: int) -> dict[str, str]:
    return live({mission_channel(mission_id)}, f"/events/missions/{mission_id}/")


def api_url(name: str, pk: int) -> str | None:
    """The URL of an API action, or None while that action does not exist yet."""
    try:
        return reverse(name, args=[pk])
    except NoReverseMatch:
        return None


def describe_check(spec: Any) -> str:
    if not spec:
        return ""
    if not isinstance(spec, dict):
        return str(spec)
    if "run" in spec:
        text = f"run: {spec['run']}"
        if spec.get("expect_exit", 0) != 0:
            text += f" (exit {spec['expect_exit']})"
        if spec.get("expect_output"):
            text += f" output ~ /{spec['expect_output']}/"
        if spec.get("network") is True:  # it reaches the network from its sandbox (docs/SANDBOX.md)
            text += " · with network"
        return text
    if "file" in spec:
        for op in ("contains", "not_contains"):
            if op in spec:
                return f"file {spec['file']} {op.replace('_', ' ')} /{spec[op]}/"
        return f"file {spec['file']} {'exists' if spec.get('exists', True) else 'is absent'}"
    return ", ".join(f"{k}: {v}" for k, v in spec.items())


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return str(timedelta(seconds=round(seconds)))


LABELS = {
    "needs_fix": "needs fix",
    "not_started": "not started",
    "needs_coverage": "needs coverage",
    "in_progress": "in progress",
}


def label(state: str | None) -> str:
    return LABELS.get(state or "", (state or "").replace("_", " "))


def describe_event(event, feature_keys: dict[int, str], milestone_keys: dict[int, str] | None = None) -> str:
    """One line of the activity feed, built from the event's structure (never free text
    beyond the short reasons the loop records)."""
    e = _Event(event.payload or {}, feature_keys, milestone_keys or {})
    kind = event.type
    text = TEXTS.get(kind)
    if text is not None:
        return text(e)
    if kind.startswith("assertion:"):
        tail = f" ↔ {e.feature()}" if e.p.get("feature") else ""
        return f"{e.p.get('key')} {kind.split(':', 1)[1]}{tail}"
    if kind.split(":", 1)[0] in NAMED_CHANGES:
        return _named_change(kind, e)
    return kind


@dataclass(frozen=True)
class _Event:
    """An event's payload, with the keys that name its features and milestones."""

    p: dict[str, Any]
    feature_keys: dict[int, str]
    milestone_keys: dict[int, str]

    def feature(self, key: str = "feature") -> str:
        fid = self.p.get(key)
        return self.feature_keys.get(fid, f"#{fid}") if fid is not None else "?"

    def milestone(self) -> str:
        mid = self.p.get("milestone")
        # Milestone ids are ints: any other value (or none) names no milestone.
        name = self.milestone_keys.get(mid, f"#{mid}") if isinstance(mid, int) else f"#{mid}"
        return f"milestone {name}"

    def target(self) -> str:
        """What a run judges: its feature, or else its milestone."""
        return self.feature() if self.p.get("feature") else self.milestone()


def _feature_updated(e: _Event) -> str:
    p = e.p
    if p.get("change") in ("created", "edited", "deleted"):
        return f"{e.feature()} {p['change']}"
    text = f"{e.feature()}: {label(p.get('from'))} → {label(p.get('loop_state'))}"
    return text + (f" ({p['cause'].replace('_', ' ')})" if p.get("cause") else "")


def _run_completed(e: _Event) -> str:
    counts = e.p.get("counts") or {}
    tail = (
        f" — {counts.get('pass', 0)} pass, {counts.get('fail', 0)} fail, {counts.get('blocked', 0)} blocked"
        if counts
        else ""
    )
    return f"run #{e.p.get('run')} {e.p.get('status')} for {e.target()}{tail}"


def _task_updated(e: _Event) -> str:
    p = e.p
    text = f"task #{p.get('task')} of {e.feature()} {p.get('change') or p.get('status')}"
    return text + (f": {p['warning']}" if p.get("warning") else "")


# The events whose line is their own; "assertion:…" and the named changes below share one form.
TEXTS: dict[str, Callable[[_Event], str]] = {
    "feature:updated": _feature_updated,
    "validator-run:started": lambda e: f"run #{e.p.get('run')} started for {e.target()} ({e.p.get('trigger', '')})",
    "validator-run:completed": _run_completed,
    "validator-run:failures-recorded": lambda e: (
        f"run #{e.p.get('run')}: {e.p.get('count')} failure(s) {', '.join(e.p.get('assertions', []))}"
    ),
    "fix-feature:created": lambda e: (
        f"fix {e.feature()} created for {e.feature('source')} (round {e.p.get('round')}, {e.p.get('budget_left')} left)"
    ),
    "task:updated": _task_updated,
    "milestone:validation:updated": lambda e: (
        f"{e.milestone()} rollup {label(e.p.get('state'))} ({e.p.get('passed')}/{e.p.get('total')} passed)"
    ),
    "slice:activated": lambda e: f"slice {e.p.get('key')} activated",
    "review:progress": lambda e: f"review #{e.p.get('review')} {e.p.get('state') or e.p.get('progress') or ''}".strip(),
    "forge-delivery:processed": lambda e: (
        f"{e.p.get('provider')} {e.p.get('event') or 'delivery'} {e.p.get('state')}"
        + (f" → task #{e.p['task']}" if e.p.get("task") else "")
        + (f" — {e.p['reason']}" if e.p.get("reason") else "")
    ),
}


# The named changes of the plan and of the loop's follow-ups: "<subject> <what happened>",
# then what the payload says about why (docs/ARCHITECTURE.md, "State machines").
NAMED_CHANGES = frozenset({"mission", "milestone", "slice", "fix-feature", "follow-up"})


def _named_change(kind: str, e: _Event) -> str:
    p = e.p
    noun, _, verb = kind.partition(":")
    subject = {
        "mission": "mission",
        "milestone": e.milestone(),
        "slice": f"slice {p.get('key') or '#' + str(p.get('slice'))}",
        "fix-feature": f"fix for {e.feature('feature')}",
        "follow-up": f"follow-up {label(p.get('step'))}",
    }[noun]
    if noun == "mission" and verb == "autopilot":
        verb = "autopilot on" if p.get("enabled") else "autopilot off"
    bits = [f"{subject} {label(verb)}".strip()]
    if p.get("changed"):
        bits.append(", ".join(map(str, p["changed"]))[:200])
    for why in ("cause", "code", "reason"):
        if p.get(why):
            bits.append(label(str(p[why]))[:200])
    text = " — ".join(bits)
    return text[:1].upper() + text[1:]
