"""A mission as its file: deterministic, every field written, re-importable."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from missions import hooks
from missions.models import ContractAssertion, FeatureAssertion, Milestone, Mission, MissionFeature, Slice
from missions.services.files import yaml_io
from missions.services.files.fields import plain
from missions.services.files.schema import (
    ASSERTION_FIELDS,
    FEATURE_FIELDS,
    MILESTONE_FIELDS,
    MISSION_FIELDS,
    SLICE_FIELDS,
)

# Export writes a check's keys in this order (then any other key, sorted).
_CHECK_KEY_ORDER = (
    "run",
    "shell",
    "expect_exit",
    "expect_output",
    "timeout",
    "network",
    "file",
    "exists",
    "contains",
    "not_contains",
    "protect",
)


def mission_export(*, mission: Mission) -> str:
    """The mission as a mission file: deterministic, every field written, re-importable."""
    milestones = list(Milestone.objects.filter(mission=mission).order_by("order", "id"))
    ms_pos = {m.pk: i for i, m in enumerate(milestones)}
    ms_key = {m.pk: m.key for m in milestones}
    deps: dict[int, list[int]] = defaultdict(list)
    for frm, to in Milestone.dependencies.through.objects.filter(from_milestone__mission=mission).values_list(
        "from_milestone_id", "to_milestone_id"
    ):
        if to in ms_pos:
            deps[frm].append(to)
    assertions = sorted(
        ContractAssertion.objects.filter(mission=mission), key=lambda a: (ms_pos[a.milestone_id], a.order, a.pk)
    )
    as_pos = {a.pk: i for i, a in enumerate(assertions)}
    as_key = {a.pk: a.key for a in assertions}
    by_ms: dict[int, list] = defaultdict(list)
    for a in assertions:
        by_ms[a.milestone_id].append(a)
    slices: dict[int, list] = defaultdict(list)
    for s in Slice.objects.filter(mission=mission).order_by("order", "id"):
        slices[s.milestone_id].append(s)
    features: dict[int, list] = defaultdict(list)
    for f in MissionFeature.objects.filter(mission=mission).order_by("order", "id"):
        features[f.slice_id].append(f)
    links: dict[int, list[int]] = defaultdict(list)
    for feature_id, assertion_id in FeatureAssertion.objects.filter(feature__mission=mission).values_list(
        "feature_id", "assertion_id"
    ):
        links[feature_id].append(assertion_id)

    def feature_data(f: MissionFeature) -> dict[str, Any]:
        data = {name: getattr(f, name) for name in FEATURE_FIELDS}
        data["assertions"] = yaml_io.KeyList(as_key[a] for a in sorted(links[f.pk], key=as_pos.__getitem__))
        return data

    def assertion_data(a: ContractAssertion) -> dict[str, Any]:
        data = {name: plain(getattr(a, name)) for name in ASSERTION_FIELDS if name != "check"}
        data["check"] = _canonical_check(a.check_spec)
        return data

    document: dict[str, Any] = {
        "mission": {name: plain(getattr(mission, name)) for name in MISSION_FIELDS},
        "milestones": [
            {
                **{name: getattr(m, name) for name in MILESTONE_FIELDS},
                "dependencies": yaml_io.KeyList(ms_key[d] for d in sorted(deps[m.pk], key=ms_pos.__getitem__)),
                "assertions": [assertion_data(a) for a in by_ms[m.pk]],
                "slices": [
                    {
                        **{name: getattr(s, name) for name in SLICE_FIELDS},
                        "features": [feature_data(f) for f in features[s.pk]],
                    }
                    for s in slices[m.pk]
                ],
            }
            for m in milestones
        ],
    }
    for _, sections in hooks.mission_file_sections.send(sender=None, mission=mission):
        if isinstance(sections, dict):  # `forge:`, written by the floor that keeps it
            document.update(sections)
    return yaml_io.dump(document)


def _canonical_check(check: Any) -> Any:
    if not isinstance(check, dict):
        return check
    known = [k for k in _CHECK_KEY_ORDER if k in check]
    return {k: check[k] for k in known + sorted(k for k in check if k not in _CHECK_KEY_ORDER)}
