"""Missions list, mission page and feature page, and their fragments.

Object-level permission is mission membership (`visible_missions`): anything else
answers 404, exactly like the API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.utils.timesince import timesince
from django.views.decorators.http import require_safe

from missions import selectors as plan
from missions.delivery import GLOBAL_CHANNEL
from missions.models import LoopState, Milestone, Mission, MissionFeature
from missions.streams import user_channels
from validation import selectors
from validation.views import common
from validation.views.charts import legend, rounds_svg

if TYPE_CHECKING:
    # Lint-only dependency (django-stubs-ext): names an annotated model for the type checker.
    from django_stubs_ext import WithAnnotations

# --- missions list -----------------------------------------------------------------------


class _ListedMission(selectors.DashboardCounts):
    activity: str  # set below, for the template


def _list_context(request) -> dict:
    # The rows gain `activity` here; the cast only says so, it converts nothing.
    missions = cast("list[WithAnnotations[Mission, _ListedMission]]", selectors.dashboard_missions(user=request.user))
    now = timezone.now()
    for m in missions:
        if m.last_event_at:
            recent = (now - m.last_event_at).total_seconds() < 60
            m.activity = "just now" if recent else f"{timesince(m.last_event_at, now)} ago"
    return {"missions": missions}


@login_required
@require_safe
def mission_list(request):
    channels = user_channels(request.user)
    # A user who is a member of nothing has no stream to follow (the global one is staff's).
    live = common.live(channels, "/events/missions/") if request.user.is_staff or GLOBAL_CHANNEL not in channels else {}
    return render(request, "missions/mission_list.html", {**live, **_list_context(request)})


@login_required
@require_safe
def mission_list_part(request):
    return common.fragment(request, "missions/_mission_rows.html", _list_context(request))


# --- mission page ------------------------------------------------------------------------


def _mission(request, pk: int) -> Mission:
    return get_object_or_404(plan.visible_missions(user=request.user).select_related("owner"), pk=pk)


def _header_context(mission: Mission) -> dict:
    counts = MissionFeature.objects.filter(mission=mission).aggregate(
        total=Count("id"),
        passed=Count("id", filter=Q(loop_state__in=[LoopState.PASSED, LoopState.SUPERSEDED])),
        blocked=Count("id", filter=Q(loop_state=LoopState.BLOCKED)),
        validating=Count("id", filter=Q(loop_state=LoopState.VALIDATING)),
    )
    return {"mission": mission, "counts": counts}


def _milestones(mission: Mission, milestone_id: int | None = None) -> list[dict]:
    milestones = selectors.mission_overview(mission=mission, milestone_id=milestone_id)
    for m in milestones:
        m["chart"] = rounds_svg(m["rounds"], chart_id=f"rounds-{m['id']}", name=m["title"])
    return milestones


def _assertions(mission: Mission) -> list[dict]:
    rows = selectors.mission_assertions(mission=mission)
    for row in rows:
        row["check_text"] = common.describe_check(row["check_spec"])
    return rows


def _feed(mission: Mission) -> list:
    events = selectors.mission_feed(mission=mission)
    keys = dict(MissionFeature.objects.filter(mission=mission).values_list("id", "key"))
    milestones = dict(Milestone.objects.filter(mission=mission).values_list("id", "key"))
    for event in events:
        event.text = common.describe_event(event, keys, milestones)
    return events


MISSION_PARTS = {
    "header": ("missions/_mission_header.html", lambda m, _id: _header_context(m)),
    "tree": ("missions/_mission_tree.html", lambda m, _id: {"milestones": _milestones(m), "legend": legend()}),
    "milestone": ("missions/_milestone.html", lambda m, mid: {"m": _one_milestone(m, mid)}),
    "assertions": ("missions/_assertions_panel.html", lambda m, _id: {"assertions": _assertions(m)}),
    "feed": ("missions/_feed.html", lambda m, _id: {"events": _feed(m)}),
}


def _one_milestone(mission: Mission, milestone_id: int | None) -> dict:
    found = _milestones(mission, milestone_id) if milestone_id else []
    if not found:
        raise Http404("no such milestone in this mission")
    return found[0]


@login_required
@require_safe
def mission_detail(request, pk: int):
    live = common.mission_live(pk)  # before any read: later changes are replayed to the page
    mission = _mission(request, pk)
    context = {
        **live,
        **_header_context(mission),
        "milestones": _milestones(mission),
        "legend": legend(),
        "assertions": _assertions(mission),
        "events": _feed(mission),
    }
    return render(request, "missions/mission_detail.html", context)


@login_required
@require_safe
def mission_part(request, pk: int, part: str, part_id: int | None = None):
    if part not in MISSION_PARTS:
        raise Http404("no such part")
    mission = _mission(request, pk)
    template, build = MISSION_PARTS[part]
    return common.fragment(request, template, {"mission": mission, **build(mission, part_id)})


# --- feature page ------------------------------------------------------------------------


def _feature(request, pk: int) -> MissionFeature:
    qs = MissionFeature.objects.filter(mission__in=plan.visible_mission_ids(user=request.user))
    return get_object_or_404(qs.select_related("mission", "slice__milestone", "generated_from", "last_run"), pk=pk)


def _runs(feature: MissionFeature) -> list:
    runs = selectors.feature_runs(feature=feature)
    for run in runs:
        run.duration_text = common.duration_text(run.duration_seconds)
    return runs


def _feature_assertions(feature: MissionFeature) -> list:
    rows = selectors.feature_assertions(feature=feature)
    for a in rows:
        a.check_text = common.describe_check(a.check_spec)
    return rows


def _feature_header(feature: MissionFeature) -> dict:
    return {
        "lineage": selectors.feature_lineage(feature=feature),
        "review_url": common.api_url("feature-review", feature.pk),
        "running": feature.runs.filter(status="running").first(),
    }


FEATURE_PARTS = {
    "header": ("missions/_feature_header.html", _feature_header),
    "assertions": ("missions/_feature_assertions.html", lambda f: {"assertions": _feature_assertions(f)}),
    "runs": ("missions/_feature_runs.html", lambda f: {"runs": _runs(f)}),
    "lineage": ("missions/_feature_lineage.html", lambda f: {"lineage": selectors.feature_lineage(feature=f)}),
    "tasks": ("missions/_feature_tasks.html", lambda f: {"tasks": selectors.feature_tasks(feature=f)}),
    "reviews": ("missions/_feature_reviews.html", lambda f: {"reviews": selectors.feature_reviews(feature=f)}),
}


feature_detail, feature_part = common.object_pages(
    noun="feature",
    template="missions/feature_detail.html",
    parts=FEATURE_PARTS,
    load=_feature,
    mission_of=lambda pk: MissionFeature.objects.filter(pk=pk).values_list("mission_id", flat=True).first() or 0,
)
