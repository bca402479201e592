"""What a run judges (docs/TRUTH.md): the revision, the assertion set frozen on it, the
validator profile, the protection and the environment, and the fingerprint over them all.
Two runs with one fingerprint judge the same thing: an identical pass is reused, and
identical failures stop the feature (`verdicts/admit.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fusion_site.repos.snapshots import FULL_COMMIT, SnapshotError, pin_branch, pin_revision
from fusion_site.repos.sources import UnknownRevision
from fusion_site.runtime import sandbox
from missions.environment_spec import declared_for, effective
from missions.errors import Invalid
from missions.models import MissionFeature
from missions.services.verdict_settings import mission_base
from validation import fastpaths, profiles
from validation.journal import canonical, sha256_of
from validation.selectors import feature_revision


@dataclass(frozen=True)
class RunInput:
    """Everything a run judges, as it is frozen on the run's row (`runs.new_run`)."""

    profile: dict[str, Any]
    revision: str
    revision_name: str
    assertions: list[dict[str, Any]]
    protection: dict[str, Any]
    fingerprint: str


def run_input(
    *, mission, milestone, profile: dict[str, Any], assertions: list[dict[str, Any]], revision: str, revision_name: str
) -> RunInput:
    """The input of a run of `milestone` (or of a feature under it): the protection frozen
    now (`mission_protection`, which may raise `SnapshotError`) and the fingerprint."""
    protection = mission_protection(mission, assertions)
    return RunInput(
        profile=profile,
        revision=revision,
        revision_name=revision_name,
        assertions=assertions,
        protection=protection,
        fingerprint=input_fingerprint(
            revision=revision,
            assertions=assertions,
            profile=profile,
            protection=protection,
            environment=run_environment(mission, milestone),
        ),
    )


def unpinned(exc: SnapshotError) -> Invalid:
    """What a person's request is told when the revision or the base cannot be pinned."""
    code = "unknown_revision" if isinstance(exc, UnknownRevision) else "workspace_unavailable"
    return Invalid(str(exc), code=code)


# A frozen assertion's fields, by the model field each comes from: one list for both forms.
FROZEN_FIELDS = (
    ("key", "key"),
    ("title", "title"),
    ("statement", "statement"),
    ("check", "check_spec"),
    ("scope", "scope"),
)
_FROZEN_NAMES = [name for name, _field in FROZEN_FIELDS]
_FROZEN_COLUMNS = tuple(field for _name, field in FROZEN_FIELDS)


def feature_assertion_specs(feature: MissionFeature) -> list[dict[str, Any]]:
    """The feature's assertion set as a run freezes it: what it is judged by, nothing else
    (the frozen fields only, not the rows)."""
    return [
        dict(zip(_FROZEN_NAMES, row, strict=True))
        for row in fastpaths.feature_assertion_values(feature_id=feature.pk, fields=_FROZEN_COLUMNS)
    ]


def frozen_assertion(a) -> dict[str, Any]:
    return {name: getattr(a, field) for name, field in FROZEN_FIELDS}


def _judged(assertions: list[dict]) -> list[tuple]:
    return [(a["key"], a["statement"], canonical(a.get("check"))) for a in assertions]


def same_contract(current: list[dict], frozen: list[dict]) -> bool:
    """Whether two assertion sets judge the same thing (keys, statements, checks)."""
    return _judged(current) == _judged(frozen)


def input_fingerprint(
    *,
    revision: str,
    assertions: list[dict[str, Any]],
    profile: dict[str, Any],
    protection: dict[str, Any] | None = None,
    sandbox_kind: str | None = None,
    environment: dict[str, Any] | None = None,
) -> str:
    """`sandbox_kind`: what the run's commands ran in ("bubblewrap", "none"); by default
    what they would run in here. Part of the key: a pass obtained unconfined is never
    reused for a run that would be confined (docs/SANDBOX.md). `environment`: the
    declared environment with its defaults (`run_environment`), so that a pass under
    another environment is never reused (docs/ENVIRONMENTS.md)."""
    judged = [{"key": a["key"], "statement": a["statement"], "check": a["check"]} for a in assertions]
    return sha256_of(
        {
            "revision": revision,
            "assertions": judged,
            "validator": profiles.public_config(profile),
            "sandbox": sandbox_kind or sandbox.status().kind,
            **({"protection": protection} if protection else {}),
            **({"environment": environment} if environment else {}),
        }
    )


def run_environment(mission, milestone) -> dict[str, Any] | None:
    """The environment a run of `milestone` uses: its own, else the mission's, with its defaults."""
    return effective(declared_for(mission.environment, milestone.environment))


def mission_protection(mission, assertions: list[dict[str, Any]]) -> dict[str, Any]:
    """The protection a run judges under (the mission's patterns, and the base a check's
    own `protect` restores from), frozen with the mission's pinned base (`base_commit`,
    set when a person set the base: never where a branch points now, which the judged
    work may have moved; docs/TRUTH.md)."""
    protects = any((a.get("check") or {}).get("protect") for a in assertions)
    if not mission.protected_paths and not protects:
        return {}
    base = mission_base(mission)
    return {
        "paths": list(mission.protected_paths),
        "on_change": mission.on_protected_change,
        "base": base,
        "runner_config": bool(mission.protect_runner_config),  # what decides how protected tests run (protect.py)
    }


def branch_revision(mission) -> tuple[str, str]:
    """(commit, branch name) of the line of work a mission's revisions are judged on when
    nothing landed one: the head of its `branch`, or of the repository's default branch,
    pinned now (`UnknownRevision` when the branch does not exist; docs/TRUTH.md)."""
    name, commit = pin_branch(mission.source(), mission.branch.strip())
    return commit, name


def judged_revision(feature: MissionFeature, revision: str | None = None, name: str = "") -> tuple[str, str]:
    """(commit, branch name) a validation of `feature` judges: the caller's `revision` (its
    `name`, when the caller carries a branch an earlier run named), else the revision the
    feature stands on (`feature_revision`), else its mission's branch; the name is '' but
    for a branch's head. ('', '') when there is nothing to judge (no repository)."""
    if revision:
        return _pinned(feature, revision), name
    standing = feature_revision(feature)
    if standing or not feature.mission.repository:
        return standing, ""
    return branch_revision(feature.mission)


def _pinned(feature: MissionFeature, revision: str) -> str:
    if FULL_COMMIT.match(revision) or not feature.mission.repository:
        return revision
    return pin_revision(feature.mission.source(), revision)
