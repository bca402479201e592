"""Create, change and delete the planning hierarchy and its contract assertions.

Every function runs in one transaction, refuses what a user may not do, recomputes the
rollups its change affects and publishes the matching event after commit. Each takes the
mission's row lock before it reads or writes any row of the mission (`writing.in_mission`): the
lock order of every step of the loop (`missions.locks.lock_mission`), so an edit racing
a verdict waits for it instead of deadlocking with it. New or moved work reopens every
complete node above it (`missions.transitions.progress`: `*_placed`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction

from missions.access import audience, revoke_on_commit
from missions.checks_spec import check_spec_problems
from missions.errors import Conflict, Invalid
from missions.models import (
    AssertionScope,
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionFeature,
    Slice,
    TaskStatus,
)
from missions.outbox import publish_on_commit
from missions.services.rollup import milestone_rollup_refresh
from missions.services.verdict_settings import base_changed, settle_milestone_environment, settle_mission_fields
from missions.services.writing import apply_fields, in_mission, require_staff_for_code, unique_key_guard
from missions.transitions.progress import feature_placed, milestone_inputs_changed, milestone_placed, slice_placed

# --- missions ------------------------------------------------------------------------


@unique_key_guard
def mission_create(*, user, members: Iterable = (), **fields: Any) -> Mission:
    require_staff_for_code(user=user, old="", new=fields.get("executor_command", ""), field="executor_command")
    fields = settle_mission_fields(mission=None, fields=fields, user=user)
    mission = Mission.objects.create(owner=user if user and user.is_authenticated else None, **fields)
    if members:
        mission.members.set(members)
    publish_on_commit(
        mission,
        "mission:created",
        {"mission": mission.pk, "status": mission.status},
        actor_id=getattr(user, "pk", None),
    )
    return mission


@unique_key_guard
def mission_update(*, mission: Mission, user, members: Iterable | None = None, **fields: Any) -> Mission:
    require_staff_for_code(
        user=user,
        old=mission.executor_command,
        new=fields.get("executor_command", mission.executor_command),
        field="executor_command",
    )
    fields = settle_mission_fields(mission=mission, fields=fields, user=user)
    before, base = audience(mission.pk), mission.base_commit
    changed = apply_fields(mission, fields)
    base_changed(mission=mission, old=base, actor_id=getattr(user, "pk", None))
    if members is not None and set(mission.members.all()) != set(members):
        mission.members.set(members)
        changed.append("members")
    revoke_on_commit(mission.pk, before - audience(mission.pk))
    if changed:
        publish_on_commit(
            mission,
            "mission:updated",
            {"mission": mission.pk, "status": mission.status, "changed": sorted(changed)},
            actor_id=getattr(user, "pk", None),
        )
    return mission


# --- milestones and slices -----------------------------------------------------------


def _check_dependencies(
    milestone: Milestone | None, mission: Mission, dependencies: Iterable[Milestone]
) -> list[Milestone]:
    deps = list(dependencies)
    for dep in deps:
        if dep.mission_id != mission.pk:
            raise Invalid(
                "a dependency belongs to another mission",
                fields={"dependencies": ["must be milestones of the same mission"]},
            )
        if milestone is not None and dep.pk == milestone.pk:
            raise Invalid("a milestone cannot depend on itself", fields={"dependencies": ["cannot depend on itself"]})
    if milestone is not None and _creates_cycle(milestone, deps):
        raise Invalid(
            "dependencies would form a cycle", code="dependency_cycle", fields={"dependencies": ["would form a cycle"]}
        )
    return deps


def _creates_cycle(milestone: Milestone, deps: list[Milestone]) -> bool:
    edges = dict.fromkeys(Milestone.objects.filter(mission_id=milestone.mission_id).values_list("id", flat=True))
    graph: dict[int, set[int]] = {pk: set() for pk in edges}
    for src, dst in Milestone.dependencies.through.objects.filter(
        from_milestone__mission_id=milestone.mission_id
    ).values_list("from_milestone_id", "to_milestone_id"):
        graph[src].add(dst)
    graph[milestone.pk] = {d.pk for d in deps}
    stack, seen = list(graph[milestone.pk]), set()
    while stack:
        node = stack.pop()
        if node == milestone.pk:
            return True
        if node not in seen:
            seen.add(node)
            stack.extend(graph.get(node, ()))
    return False


@unique_key_guard
def milestone_create(*, user, mission: Mission, dependencies: Iterable[Milestone] = (), **fields: Any) -> Milestone:
    deps = _check_dependencies(None, mission, dependencies)
    if fields.get("environment") is not None:
        settle_milestone_environment(mission=mission, old=None, new=fields["environment"], user=user)
    milestone = Milestone.objects.create(mission=mission, **fields)
    milestone.dependencies.set(deps)
    publish_on_commit(
        mission,
        "milestone:created",
        {"mission": mission.pk, "milestone": milestone.pk, "key": milestone.key, "status": milestone.status},
        actor_id=getattr(user, "pk", None),
    )
    milestone_rollup_refresh(milestone_ids=[milestone.pk])
    milestone_placed(mission_id=mission.pk, milestone_id=milestone.pk)
    return milestone


@unique_key_guard
def milestone_update(
    *, user, milestone: Milestone, dependencies: Iterable[Milestone] | None = None, **fields: Any
) -> Milestone:
    fields.pop("mission", None)
    if "environment" in fields:
        settle_milestone_environment(
            mission=milestone.mission, old=milestone.environment, new=fields["environment"], user=user
        )
    apply_fields(milestone, fields)
    if dependencies is not None:
        milestone.dependencies.set(_check_dependencies(milestone, milestone.mission, dependencies))
    return milestone


@unique_key_guard
def slice_create(*, user, milestone: Milestone, **fields: Any) -> Slice:
    slice_ = Slice(milestone=milestone, **fields)
    slice_.save()
    publish_on_commit(
        milestone.mission_id,
        "slice:created",
        {"mission": milestone.mission_id, "slice": slice_.pk, "milestone": milestone.pk, "key": slice_.key},
        actor_id=getattr(user, "pk", None),
    )
    slice_placed(mission_id=milestone.mission_id, slice_id=slice_.pk, milestone_id=milestone.pk)
    return slice_


@unique_key_guard
def slice_update(*, user, slice_: Slice, **fields: Any) -> Slice:
    milestone = fields.pop("milestone", slice_.milestone)
    if milestone.mission_id != slice_.mission_id:
        raise Invalid(
            "a slice cannot move to another mission", fields={"milestone": ["must belong to the same mission"]}
        )
    fields["milestone"] = milestone
    was = slice_.milestone_id
    if "milestone" in apply_fields(slice_, fields):
        slice_placed(mission_id=slice_.mission_id, slice_id=slice_.pk, milestone_id=slice_.milestone_id, was=was)
    return slice_


def _linked_milestone_ids(**feature_filter: Any) -> set[int]:
    """Milestones whose rollup depends on links of the matching features."""
    return set(
        ContractAssertion.objects.filter(**{f"feature_links__feature__{k}": v for k, v in feature_filter.items()})
        .values_list("milestone_id", flat=True)
        .distinct()
    )


@in_mission
def milestone_delete(*, user, milestone: Milestone) -> None:
    # Its features may cover assertions of other milestones: their rollups change too.
    milestone_ids = _linked_milestone_ids(slice__milestone=milestone) - {milestone.pk}
    milestone.delete()
    milestone_rollup_refresh(milestone_ids=milestone_ids)


@in_mission
def slice_delete(*, user, slice_: Slice) -> None:
    milestone_ids = _linked_milestone_ids(slice=slice_)
    slice_.delete()
    milestone_rollup_refresh(milestone_ids=milestone_ids)


# --- features ------------------------------------------------------------------------


def _feature_event(feature: MissionFeature, user=None, **extra: Any) -> None:
    publish_on_commit(
        feature.mission_id,
        "feature:updated",
        {
            "feature": feature.pk,
            "loop_state": feature.loop_state,
            "status": feature.status,
            **extra,
        },
        actor_id=getattr(user, "pk", None),
    )


@unique_key_guard
def feature_create(
    *, user, slice_: Slice, assertions: Iterable[ContractAssertion] = (), **fields: Any
) -> MissionFeature:
    feature = MissionFeature(slice=slice_, **fields)
    feature.save()
    _feature_event(feature, user, change="created")
    feature_placed(
        mission_id=feature.mission_id, feature_id=feature.pk, slice_id=slice_.pk, milestone_id=slice_.milestone_id
    )
    for assertion in assertions:
        assertion_link(user=user, feature=feature, assertion=assertion)
    return feature


@unique_key_guard
def feature_update(*, user, feature: MissionFeature, **fields: Any) -> MissionFeature:
    slice_ = fields.pop("slice", feature.slice)
    if slice_.mission_id != feature.mission_id:
        raise Invalid("a feature cannot move to another mission", fields={"slice": ["must belong to the same mission"]})
    fields["slice"] = slice_
    was = (feature.slice_id, feature.slice.milestone_id)
    changed = apply_fields(feature, fields)
    if changed:
        _feature_event(feature, user, change="edited")
    if "slice" in changed:
        feature_placed(
            mission_id=feature.mission_id,
            feature_id=feature.pk,
            slice_id=slice_.pk,
            milestone_id=slice_.milestone_id,
            was=was,
        )
    return feature


@in_mission
def feature_delete(*, user, feature: MissionFeature, force: bool = False) -> None:
    if not force and feature.tasks.filter(status=TaskStatus.IN_PROGRESS).exists():
        raise Conflict("the feature's task is running; stop it first or delete with force", code="task_running")
    milestone_ids = list(feature.assertions.values_list("milestone_id", flat=True).distinct())
    mission_id, pk = feature.mission_id, feature.pk
    feature.delete()
    publish_on_commit(
        mission_id, "feature:updated", {"feature": pk, "change": "deleted"}, actor_id=getattr(user, "pk", None)
    )
    milestone_rollup_refresh(milestone_ids=milestone_ids)


# --- contract assertions -------------------------------------------------------------


def _assertion_payload(assertion: ContractAssertion) -> dict[str, Any]:
    return {
        "assertion": assertion.pk,
        "key": assertion.key,
        "milestone": assertion.milestone_id,
        "status": assertion.status,
        "scope": assertion.scope,
    }


def _judged_by_changed(milestone_ids: list[int], *, cause: str) -> None:
    """What these milestones are judged by changed: new rollups, and a complete one is not
    complete any more (its last milestone run judged another set; docs/TRUTH.md)."""
    milestone_rollup_refresh(milestone_ids=milestone_ids)
    milestone_inputs_changed(milestone_ids=milestone_ids, cause=cause)


def _require_valid_check(fields: dict[str, Any]) -> None:
    """The one shape rule every writer applies (API, mission files, admin via the model)."""
    spec = fields.get("check_spec")
    problems = check_spec_problems(spec) if spec is not None else []
    if problems:
        raise Invalid(
            "the check is not valid: " + "; ".join(problems), code="invalid_check", fields={"check": problems}
        )


@unique_key_guard
def assertion_create(*, user, milestone: Milestone, **fields: Any) -> ContractAssertion:
    require_staff_for_code(user=user, old=None, new=fields.get("check_spec"), field="check")
    _require_valid_check(fields)
    assertion = ContractAssertion(milestone=milestone, **fields)
    assertion.save()
    publish_on_commit(
        milestone.mission_id, "assertion:created", _assertion_payload(assertion), actor_id=getattr(user, "pk", None)
    )
    _judged_by_changed([milestone.pk], cause="assertion_created")
    return assertion


@unique_key_guard
def assertion_update(*, user, assertion: ContractAssertion, **fields: Any) -> ContractAssertion:
    require_staff_for_code(
        user=user, old=assertion.check_spec, new=fields.get("check_spec", assertion.check_spec), field="check"
    )
    _require_valid_check(fields)
    old_milestone = assertion.milestone_id
    milestone = fields.get("milestone", assertion.milestone)
    if milestone.mission_id != assertion.mission_id:
        raise Invalid(
            "an assertion cannot move to another mission", fields={"milestone": ["must belong to the same mission"]}
        )
    if fields.get("scope") == AssertionScope.MILESTONE and assertion.feature_links.exists():
        raise Invalid(
            "unlink the assertion from its features before making it milestone-scoped",
            code="linked_assertion",
            fields={"scope": ["the assertion is linked to features"]},
        )
    if apply_fields(assertion, fields):
        publish_on_commit(
            assertion.mission_id, "assertion:updated", _assertion_payload(assertion), actor_id=getattr(user, "pk", None)
        )
        _judged_by_changed([old_milestone, assertion.milestone_id], cause="assertion_updated")
    return assertion


@in_mission
def assertion_delete(*, user, assertion: ContractAssertion) -> None:
    payload = _assertion_payload(assertion)
    mission_id = assertion.mission_id
    assertion.delete()
    publish_on_commit(mission_id, "assertion:deleted", payload, actor_id=getattr(user, "pk", None))
    _judged_by_changed([payload["milestone"]], cause="assertion_deleted")


@in_mission
def assertion_link(*, user, feature: MissionFeature, assertion: ContractAssertion) -> FeatureAssertion:
    if assertion.mission_id != feature.mission_id:
        raise Invalid(
            "the assertion belongs to another mission",
            code="wrong_mission",
            fields={"assertion": ["not in this mission"]},
        )
    if assertion.scope == AssertionScope.MILESTONE:
        raise Invalid(
            "milestone-scoped assertions cannot be linked to features",
            code="milestone_scoped",
            fields={"assertion": ["milestone-scoped assertions cannot be linked to features"]},
        )
    try:
        with transaction.atomic():
            link = FeatureAssertion.objects.create(feature=feature, assertion=assertion)
    except IntegrityError as exc:
        raise Conflict(f"{assertion.key} is already linked to this feature", code="already_linked") from exc
    publish_on_commit(
        feature.mission_id,
        "assertion:linked",
        {**_assertion_payload(assertion), "feature": feature.pk},
        actor_id=getattr(user, "pk", None),
    )
    _judged_by_changed([assertion.milestone_id, feature.slice.milestone_id], cause="assertion_linked")
    return link


@in_mission
def assertion_unlink(*, user, feature: MissionFeature, assertion: ContractAssertion) -> None:
    deleted, _ = FeatureAssertion.objects.filter(feature=feature, assertion=assertion).delete()
    if not deleted:
        raise Invalid(f"{assertion.key} is not linked to this feature", code="not_linked")
    publish_on_commit(
        feature.mission_id,
        "assertion:unlinked",
        {**_assertion_payload(assertion), "feature": feature.pk},
        actor_id=getattr(user, "pk", None),
    )
    _judged_by_changed([assertion.milestone_id, feature.slice.milestone_id], cause="assertion_unlinked")
