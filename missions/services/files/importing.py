"""Importing a validated mission file: one transaction under the mission's row lock; the
file's remaining mistakes and what the importer may not do are judged before anything is
written (`writing` saves the rows), and the work the import placed or changed reopens what
is above it."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from django.db import transaction

from fusion_site.repos.sources import SourceRefused, check_repository
from missions import hooks
from missions.access import audience, revoke_on_commit
from missions.errors import DomainError, Forbidden, Invalid, StaffOnly
from missions.hooks import announce_on_commit
from missions.locks import locked_mission
from missions.models import (
    AssertionScope,
    ContractAssertion,
    Milestone,
    Mission,
    MissionFeature,
    MissionStatus,
    Slice,
)
from missions.outbox import publish_on_commit
from missions.selectors import visible_missions
from missions.services.files.validating import Document, invalid, validated
from missions.services.files.writing import (
    Existing,
    MissionRace,
    Writer,
    write_assertions,
    write_milestones,
    write_mission,
    write_slices_and_features,
)
from missions.services.rollup import milestone_rollup_refresh
from missions.services.verdict_settings import base_changed, settle_milestone_environment, settle_mission_fields
from missions.transitions.progress import feature_placed, milestone_inputs_changed, milestone_placed, slice_placed


@dataclass
class ImportResult:
    mission: Mission
    created: bool
    changed: bool


def mission_import(
    *, document: str | dict, base_dir: pathlib.Path | None = None, user=None, owner=None
) -> tuple[Mission, bool]:
    """Create or update the mission a mission file describes; returns (mission, changed)."""
    result = mission_file_import(document=document, base_dir=base_dir, user=user, owner=owner)
    return result.mission, result.changed


def mission_file_import(
    *,
    document: str | dict,
    base_dir: pathlib.Path | None = None,
    user=None,
    owner=None,
    from_api: bool = False,
) -> ImportResult:
    """`user` is who imports (None: the command line, trusted like staff); `owner` is who the
    mission is to belong to: given, it is set on a new or an existing mission; not given, a
    new mission belongs to `user` (none from the command line: staff only see it) and an
    existing one keeps its owner. `from_api`: the file came over HTTP and has no folder."""
    doc = validated(document, base_dir, from_api=from_api)
    try:
        return _apply(doc, user, owner)
    except MissionRace:
        # A concurrent import created the same mission between our lookup and insert;
        # run again: this time we find it and update (or leave) it.
        return _apply(doc, user, owner)


def _link_errors(doc: Document, existing: Existing) -> list[str]:
    """A milestone-scoped assertion must not stay linked from a feature the file leaves alone."""
    file_features = {existing.features[f.key].pk for f in doc.all_features() if f.key in existing.features}
    feature_keys = {f.pk: f.key for f in existing.features.values()}
    errors = []
    for a in doc.all_assertions():
        current = existing.assertions.get(a.key)
        if current is None or a.values["scope"] != AssertionScope.MILESTONE:
            continue
        stray = sorted(
            feature_keys[fid] for fid, aid in existing.links if aid == current.pk and fid not in file_features
        )
        if stray:
            errors.append(
                f"{a.path}.scope: milestone-scoped assertion {a.key} is linked to features not in the file: "
                f"{', '.join(stray)}"
            )
    return errors


def _guard_staff(doc: Document, mission: Mission | None, existing: Existing, user) -> None:
    if user is None or getattr(user, "is_staff", False):
        return
    paths = []
    command = doc.mission.values["executor_command"]
    if (mission is None and command) or (mission is not None and mission.executor_command != command):
        paths.append("mission.executor_command")
    for a in doc.all_assertions():
        current = existing.assertions.get(a.key)
        stored = current.check_spec if current is not None else None
        if a.values["check_spec"] != stored:
            paths.append(f"{a.path}.check")
    if paths:
        raise StaffOnly("only staff may set checks or executor commands", fields={"errors": paths})


def _check_repository(doc: Document, mission: Mission | None, user) -> None:
    """The repository is checked with the importer's staff flag (the command line, `user=None`,
    is an operator): a local path or `file://` URL from staff only, or inside
    FUSION_WORKSPACE_ROOTS. An unchanged value is not judged again, so a member can re-import
    a mission staff pointed at a local path. Stores the text the check returns."""
    values = doc.mission.values
    if mission is not None and values["repository"] == mission.repository:
        return
    staff = user is None or bool(getattr(user, "is_staff", False))
    try:
        values["repository"] = check_repository(values["repository"], staff=staff)
    except SourceRefused as exc:
        line = f"{doc.repository_path}: {exc}"
        raise Invalid(line, code="repository_refused", fields={"errors": [line]}) from exc


def _settle(doc: Document, mission: Mission | None, existing: Existing, user) -> None:
    """The rules every writer applies (`missions/services/verdict_settings.py`): the base pinned to
    its commit, credentials where they may go, who picks the validators and the
    environments. A refusal names the file's fields (`mission.base_revision: …`) and keeps
    its code."""
    values = doc.mission.values
    try:
        settled = settle_mission_fields(mission=mission, fields=values, user=user)
    except DomainError as exc:
        lines = [f"mission.{name}: {exc.detail}" for name in exc.fields] or [f"mission: {exc.detail}"]
        raise type(exc)(lines[0], code=exc.code, fields={"errors": lines}, extra=exc.extra) from exc
    if "base_commit" in settled:
        values["base_commit"] = settled["base_commit"]
    if mission is None:  # a new mission: the importer is its owner
        return
    refused: list[DomainError] = []
    lines = []
    for node in doc.milestones:
        current = existing.milestones.get(node.key)
        old = current.environment if current is not None else None
        try:
            settle_milestone_environment(mission=mission, old=old, new=node.values["environment"], user=user)
        except DomainError as exc:
            refused.append(exc)
            lines.append(f"{node.path}.environment: {exc.detail}")
    if refused:  # every milestone it refuses, with the first one's code
        raise type(refused[0])(lines[0], code=refused[0].code, fields={"errors": lines}) from refused[0]


def _actor(user) -> int | None:
    return user.pk if user is not None and getattr(user, "is_authenticated", False) else None


def _locked_mission(key: str) -> Mission | None:
    # The row lock serializes concurrent imports of an existing mission (PostgreSQL;
    # SQLite's IMMEDIATE transactions already serialize writers).
    return locked_mission(key=key)


def _guard_visible(mission: Mission | None, user) -> None:
    """Checked under the row lock: a key another user's import took a moment ago is not
    theirs to update (a check before the transaction would race with that import)."""
    if mission is None or user is None:  # a new mission, or the command line (trusted)
        return
    if not visible_missions(user=user).filter(pk=mission.pk).exists():
        raise Forbidden("a mission with this key exists and is not yours", code="mission_key_taken")


def _apply(doc: Document, user, owner) -> ImportResult:
    with transaction.atomic():
        mission = _locked_mission(doc.mission.key)
        _guard_visible(mission, user)
        existing = Existing.load(mission)
        # The file's mistakes, those that need the stored mission included, at once; what
        # the importer may not do (staff, repository, owner) is judged of a valid file.
        if errors := [*doc.errors, *_link_errors(doc, existing)]:
            raise invalid(errors)
        _guard_staff(doc, mission, existing, user)
        _check_repository(doc, mission, user)
        _settle(doc, mission, existing, user)
        writer = Writer()
        created = mission is None
        base = mission.base_commit if mission is not None else ""
        owner_before = mission.owner_id if mission is not None else None
        before = existing.parents()
        mission = write_mission(doc.mission, mission, user, owner, writer)
        if not created:
            base_changed(mission=mission, old=base, actor_id=_actor(user))
            if owner_before is not None and mission.owner_id != owner_before:
                # The owner `owner` replaced loses the mission's live streams, unless a member.
                revoke_on_commit(mission.pk, {owner_before} - audience(mission.pk))
        milestones = write_milestones(doc, mission, existing, writer)
        assertions = write_assertions(doc, milestones, existing, writer)
        slices, features = write_slices_and_features(doc, milestones, assertions, existing, writer)
        # The sections of the floors above (`forge:`), written by their receivers.
        answers = hooks.mission_file_imported.send(sender=None, mission=mission, forge=doc.forge, user=user)
        writer.changed |= any(changed for _, changed in answers)
        if writer.changed:
            milestone_rollup_refresh(
                milestone_ids=Milestone.objects.filter(mission=mission).values_list("id", flat=True)
            )
            if not created:
                _reopen(mission, before, writer, (milestones, assertions, slices, features))
            payload = {"mission": mission.pk, "status": mission.status, "created": created, "owner": mission.owner_id}
            publish_on_commit(mission, "mission:imported", payload, actor_id=_actor(user))
        if created and mission.autopilot and mission.status == MissionStatus.ACTIVE:
            # Born active (no activation to tell it): the autopilot takes the new mission up now.
            announce_on_commit(hooks.mission_may_advance, mission_id=mission.pk)
        return ImportResult(mission=mission, created=created, changed=writer.changed)


def _reopen(
    mission: Mission,
    before: tuple[dict[int, int], dict[str, int], dict[str, int]],
    writer: Writer,
    written: tuple[dict[str, Milestone], dict[str, ContractAssertion], dict[str, Slice], dict[str, MissionFeature]],
) -> None:
    """What the services do for each change, for the changes of this import: new or moved
    work reopens every complete node above it, a changed contract its milestone
    (`missions.transitions.progress`)."""
    slice_was, feature_was, assertion_was = before
    milestones, assertions, slices, features = written
    for ms in milestones.values():
        if (Milestone, ms.pk) in writer.created:
            milestone_placed(mission_id=mission.pk, milestone_id=ms.pk)
    for sl in slices.values():
        was = None if (Slice, sl.pk) in writer.created else slice_was[sl.pk]
        slice_placed(mission_id=mission.pk, slice_id=sl.pk, milestone_id=sl.milestone_id, was=was)
    milestone_of = {sl.pk: sl.milestone_id for sl in slices.values()}
    for key, feature in features.items():
        # Where it was: its slice, and that slice's milestone as it stood before this import.
        before_feature = None if (MissionFeature, feature.pk) in writer.created else feature_was[key]
        feature_placed(
            mission_id=mission.pk,
            feature_id=feature.pk,
            slice_id=feature.slice_id,
            milestone_id=milestone_of[feature.slice_id],
            was=None if before_feature is None else (before_feature, slice_was[before_feature]),
        )
    for key, assertion in assertions.items():
        if (ContractAssertion, assertion.pk) in writer.saved:
            writer.contract_changed |= {assertion.milestone_id, assertion_was.get(key, assertion.milestone_id)}
    if writer.contract_changed:
        milestone_inputs_changed(milestone_ids=writer.contract_changed, cause="mission_imported")
