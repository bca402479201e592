"""How a mission is judged, as a person sets it (docs/TRUTH.md; docs/MISSION_FILES.md):
`settle_mission_fields` is the one check every writer makes before it writes (the API
through `hierarchy.mission_create`/`mission_update`, the admin form, mission file import
and the demo through it); a refusal is a `DomainError` with a stable code and nothing
changes.

- **The base is pinned once.** `base_revision` (a branch, a tag, a commit id) is resolved
  to `base_commit` when it is set or changed, or when the repository changes; the name is
  kept for display. Protection, diffs and the executor read `base_commit` only, so a branch
  the agent commits onto never moves what its work is compared with. A name that does not
  resolve is refused (`unknown_base_revision`). A mission stored before the pin existed is
  pinned at its next use (`mission_base`), once. A person moving the base reopens what was
  judged under the old one (`base_changed`).
- **A protected path names something.** A pattern that matches no file at the base is
  refused (`protected_path_matches_nothing`): it would protect nothing, silently.
- **Credentials go where the deployment lets them.** `credentials_env` must be a variable
  `FUSION_GIT_CREDENTIALS` lists, for a repository under one of its URL prefixes
  (`credentials_not_allowed`, for everyone); only staff set it, unless
  `FUSION_MEMBERS_SET_CREDENTIALS` (`staff_only`). The git adapter applies the same rule
  to stored rows (`fusion_site/repos/sources.py: credentials`).
- **The owner picks the judges and the protection.** `validator` and `allowed_validators`
  (the profiles that may judge the mission; admission refuses any other), and what protects
  its tests (`base_revision`, `protected_paths`, `on_protected_change`,
  `protect_runner_config`) are changed by the mission's owner or staff only (`owner_only`):
  a member could otherwise switch the mission to the weakest profile, or lift the
  protection of the tests the work is judged by. The same for the `environment` the
  checks run with (docs/ENVIRONMENTS.md), the mission's and a milestone's own.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models, transaction

from fusion_site.repos.mirrors import source_of
from fusion_site.repos.snapshots import FULL_COMMIT, SnapshotError, pin_revision
from fusion_site.repos.sources import SourceRefused, credentials_allowed, normalize, safe_revision
from missions import hooks
from missions.environment_spec import environment_problems
from missions.errors import Forbidden, Invalid, StaffOnly
from missions.locks import lock_mission
from missions.models import ContractAssertion, Milestone, Mission
from missions.outbox import publish_on_commit
from missions.transitions.progress import milestone_inputs_changed

MAX_ALLOWED_VALIDATORS = 20
# What decides how the mission's work is judged: who judges it, and what protects its tests
# from the work under judgment. A member (an agent's token among them) may not change it.
JUDGES = (
    "validator",
    "allowed_validators",
    "base_revision",
    "protected_paths",
    "on_protected_change",
    "protect_runner_config",
    "submodules",
    # What the checks run with (docs/ENVIRONMENTS.md): its `setup` runs with the network.
    "environment",
)


def _default(name: str) -> Any:
    field = Mission._meta.get_field(name)
    assert isinstance(field, models.Field)  # a column of the mission
    return field.get_default()


def _value(mission: Mission | None, fields: dict[str, Any], name: str) -> Any:
    if name in fields:
        return fields[name]
    return getattr(mission, name) if mission is not None else _default(name)


def _changed(mission: Mission | None, fields: dict[str, Any], name: str) -> bool:
    if name not in fields:
        return False
    return fields[name] != (getattr(mission, name) if mission is not None else _default(name))


def _staff(user: Any) -> bool:
    """The command line (`user=None`) is an operator."""
    return user is None or bool(getattr(user, "is_staff", False))


def settle_mission_fields(*, mission: Mission | None, fields: dict[str, Any], user: Any) -> dict[str, Any]:
    """`fields` (what a writer sets on `mission`, or on a new one) as they are to be written,
    with `base_commit` when the base is (re)pinned; refused with a `DomainError` otherwise."""
    fields = dict(fields)
    if "environment" in fields and (problems := environment_problems(fields["environment"])):
        raise Invalid("environment: " + "; ".join(problems), fields={"environment": problems})
    _check_credentials(mission, fields, user)
    _check_branch(fields)
    _check_validators(mission, fields, user)
    _settle_base(mission, fields)
    _check_protected_paths(mission, fields)
    return fields


# ---------------------------------------------------------------- credentials


def _check_credentials(mission: Mission | None, fields: dict[str, Any], user: Any) -> None:
    name = (_value(mission, fields, "credentials_env") or "").strip()
    named, moved = _changed(mission, fields, "credentials_env"), _changed(mission, fields, "repository")
    if not name or not (named or moved):
        return
    repository = (_value(mission, fields, "repository") or "").strip()
    # Without a repository yet, the variable must be listed; its URL is checked when one is set.
    allowed = credentials_allowed(name, _url(repository)) if repository else name in settings.FUSION_GIT_CREDENTIALS
    if not allowed:
        where = f" for {repository}" if repository else ""
        raise Invalid(
            f"credentials_env {name!r} may not be used{where}: the deployment lists the variables "
            "a mission may name and the URLs each may be sent to (FUSION_GIT_CREDENTIALS)",
            code="credentials_not_allowed",
            fields={"credentials_env": [f"not allowed{where}"]},
        )
    if named and not _staff(user) and not settings.FUSION_MEMBERS_SET_CREDENTIALS:
        raise StaffOnly(
            "only staff may set credentials_env", fields={"credentials_env": ["only staff may set this field"]}
        )


def _url(repository: str) -> str:
    try:
        return normalize(repository).url
    except ValueError:  # refused elsewhere with its own reason; here it matches no prefix
        return ""


# ---------------------------------------------------------------- the branch


def _check_branch(fields: dict[str, Any]) -> None:
    """A branch name git can take (whether the repository has it is asked at each
    validation that reads it, which refuses it with `unknown_revision`)."""
    name = fields.get("branch") or ""
    if not name:
        return
    try:
        problem = "" if safe_revision(name) == name else f"{name!r} has spaces around it"
    except SourceRefused as exc:
        problem = str(exc)
    if problem:
        raise Invalid(f"branch {problem}", code="invalid_branch", fields={"branch": [problem]})


# ---------------------------------------------------------------- who judges


def allowed_validators_problems(value: Any) -> list[str]:
    """What is wrong with a list of profile names (`allowed_validators`)."""
    if not isinstance(value, list):
        return ["must be a list of validator profile names"]
    if len(value) > MAX_ALLOWED_VALIDATORS:
        return [f"at most {MAX_ALLOWED_VALIDATORS} profiles"]
    limit = Mission._meta.get_field("validator").max_length or 0
    return [
        f"[{i}]: must be a profile name (a non-blank string of at most {limit} characters)"
        for i, name in enumerate(value)
        if not isinstance(name, str) or not name.strip() or len(name) > limit or "\x00" in name
    ]


def _check_validators(mission: Mission | None, fields: dict[str, Any], user: Any) -> None:
    if "allowed_validators" in fields and (problems := allowed_validators_problems(fields["allowed_validators"])):
        raise Invalid("allowed_validators: " + "; ".join(problems), fields={"allowed_validators": problems})
    changed = [name for name in JUDGES if _changed(mission, fields, name)]
    # A new repository re-pins the base (`_settle_base`): where the base's name points there
    # may be the work under judgment itself.
    if mission is not None and mission.base_revision.strip() and _changed(mission, fields, "repository"):
        changed.append("repository")
    if not changed or mission is None or _staff(user) or mission.owner_id == getattr(user, "pk", None):
        return
    raise Forbidden(
        "only the mission's owner or staff may change how it is judged (its validator profiles and protected paths)",
        code="owner_only",
        fields={name: ["only the owner or staff may change this field"] for name in changed},
    )


def settle_milestone_environment(*, mission: Mission, old: Any, new: Any, user: Any) -> None:
    """A milestone's own environment (`None`: the mission's) follows the mission's rule:
    valid, and changed by the mission's owner or staff only (`owner_only`)."""
    if new is not None and (problems := environment_problems(new)):
        raise Invalid("environment: " + "; ".join(problems), fields={"environment": problems})
    if new == old or _staff(user) or mission.owner_id == getattr(user, "pk", None):
        return
    raise Forbidden(
        "only the mission's owner or staff may change how it is judged (a milestone's environment)",
        code="owner_only",
        fields={"environment": ["only the owner or staff may change this field"]},
    )


def validators_of(mission: Mission) -> list[str]:
    """The profiles that may judge the mission: its validator, then the others it allows."""
    return list(dict.fromkeys([mission.validator, *(mission.allowed_validators or [])]))


# ---------------------------------------------------------------- the base


def pin_base(*, repository: str, credentials_env: str, name: str) -> str:
    """The full commit id `name` names at the repository now (`unknown_base_revision`).
    Without a repository yet, a full id is taken as it is and a name waits ('') until one
    is set (setting the repository pins the base)."""
    name = name.strip()
    if not repository.strip():
        return name if FULL_COMMIT.match(name) else ""
    try:
        return pin_revision(source_of(repository, credentials_env), name)
    except SnapshotError as exc:
        raise Invalid(
            f"base_revision {name!r} is not a commit of the mission's repository ({exc})",
            code="unknown_base_revision",
            fields={"base_revision": ["unknown revision"]},
        ) from exc


def _settle_base(mission: Mission | None, fields: dict[str, Any]) -> None:
    name = (_value(mission, fields, "base_revision") or "").strip()
    set_now = _changed(mission, fields, "base_revision") or _changed(mission, fields, "repository")
    if not set_now:
        return
    fields["base_commit"] = (
        pin_base(
            repository=_value(mission, fields, "repository") or "",
            credentials_env=_value(mission, fields, "credentials_env") or "",
            name=name,
        )
        if name
        else ""
    )


def _check_protected_paths(mission: Mission | None, fields: dict[str, Any]) -> None:
    patterns = _value(mission, fields, "protected_paths") or []
    repository = (_value(mission, fields, "repository") or "").strip()
    name = (_value(mission, fields, "base_revision") or "").strip()
    if not patterns or not repository or not name:
        return  # nothing protected, or nothing to read it in (`base_revision_required` says so)
    if not (_changed(mission, fields, "protected_paths") or "base_commit" in fields):
        return
    if "base_commit" not in fields:  # stored before pinning: pinned by this write
        fields["base_commit"] = (mission.base_commit if mission else "") or pin_base(
            repository=repository, credentials_env=_value(mission, fields, "credentials_env") or "", name=name
        )
    source = source_of(repository, _value(mission, fields, "credentials_env") or "")
    try:
        answers = hooks.protected_paths_unmatched.send(
            sender=None, source=source, commit=fields["base_commit"], patterns=list(patterns)
        )
    except SnapshotError as exc:
        raise Invalid(
            f"the base revision {name!r} cannot be read to check the protected paths ({exc})",
            code="unknown_base_revision",
            fields={"base_revision": ["cannot be read"]},
        ) from exc
    unmatched = list(dict.fromkeys(p for _receiver, answer in answers for p in answer or ()))
    if unmatched:
        raise Invalid(
            "protected_paths: these patterns match no file at the base revision "
            f"{name} ({fields['base_commit'][:12]}), so they would protect nothing: " + ", ".join(unmatched),
            code="protected_path_matches_nothing",
            fields={"protected_paths": [f"{p}: matches no file at the base revision" for p in unmatched]},
            extra={"patterns": unmatched},
        )


def mission_base(mission: Mission) -> str:
    """The commit protection and diffs compare with ('' without a base). A mission stored
    before bases were pinned is pinned here, at its next use, once, and stored (with the
    event `mission:base-changed`, cause `first_use`); `SnapshotError` when it cannot be."""
    if mission.base_commit or not mission.base_revision.strip():
        return mission.base_commit
    commit = pin_revision(mission.source(), mission.base_revision.strip())
    with transaction.atomic():
        lock_mission(mission.pk)
        if Mission.objects.filter(pk=mission.pk, base_commit="", base_revision=mission.base_revision).update(
            base_commit=commit
        ):
            _base_event(mission, old="", new=commit, cause="first_use", actor_id=None)
        else:  # another writer pinned or moved it meanwhile: theirs stands
            commit = Mission.objects.values_list("base_commit", flat=True).get(pk=mission.pk) or commit
    mission.base_commit = commit
    return commit


def base_changed(*, mission: Mission, old: str, actor_id: int | None) -> None:
    """After a writer stored `mission` (in its transaction): when a person moved the base,
    the event, and what was judged under the old base is not done any more (docs/TRUTH.md,
    rule 6): every milestone and the mission reopen, and each passed feature judged under
    another base is judged again (the `contract_changed` hook, cause `base_changed`)."""
    if old == mission.base_commit:
        return
    _base_event(mission, old=old, new=mission.base_commit, cause="set", actor_id=actor_id)
    protected = bool(mission.protected_paths) or (
        ContractAssertion.objects.filter(mission=mission, check_spec__has_key="protect").exists()
    )
    if protected:
        milestone_inputs_changed(
            milestone_ids=list(Milestone.objects.filter(mission=mission).values_list("id", flat=True)),
            cause="base_changed",
        )


def _base_event(mission: Mission, *, old: str, new: str, cause: str, actor_id: int | None) -> None:
    publish_on_commit(
        mission.pk,
        "mission:base-changed",
        {"mission": mission.pk, "base_revision": mission.base_revision, "from": old, "to": new, "cause": cause},
        actor_id=actor_id,
    )


def same_base(protection: dict[str, Any] | None, base_commit: str) -> bool:
    """Whether a run's frozen protection was judged against the mission's base (a run
    without protection, or a mission not pinned yet, has nothing to differ)."""
    judged = (protection or {}).get("base") or ""
    return not judged or not base_commit or judged == base_commit
