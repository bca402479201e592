"""Helpers for the lifecycle, autopilot and executor tests: missions over a real git
repository whose features are judged by real file checks (`<key>.txt` contains
`done <key>`), implementations committed for real, and readers of the audit log."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from missions.models import ContractAssertion, Milestone, Mission, MissionEvent, MissionFeature, Slice, Task, TaskStatus


def done_check(key: str) -> dict[str, Any]:
    return {"file": f"{key}.txt", "contains": f"done {key}"}


def make_mission(owner, workspace, *, key: str = "life", status: str = "planning", **fields: Any) -> Mission:
    return Mission.objects.create(
        key=key, title=key.title(), owner=owner, repository=str(workspace), status=status, **fields
    )


def add_slice(
    mission: Mission,
    milestone_key: str,
    slice_key: str,
    feature_keys: Iterable[str],
    *,
    milestone_order: int | None = None,
    slice_order: int = 0,
    check: bool = True,
    extra_check: dict | None = None,
) -> Slice:
    """A slice (and its milestone if new) with one feature per key, each linked to its own
    assertion `VAL-<key>` judged by a file check (or with no check when `check` is false)."""
    defaults = {"title": milestone_key.upper()}
    if milestone_order is not None:
        defaults["order"] = milestone_order
    milestone, _ = Milestone.objects.get_or_create(mission=mission, key=milestone_key, defaults=defaults)
    slice_ = Slice(milestone=milestone, key=slice_key, title=slice_key.upper(), order=slice_order)
    slice_.save()
    for i, key in enumerate(feature_keys):
        feature = MissionFeature(
            slice=slice_, key=key, title=f"Feature {key}", description=f"Write {key}.txt.", order=i
        )
        feature.save()
        spec = done_check(key) if check else None
        assertion = ContractAssertion(
            milestone=milestone,
            key=f"VAL-{key}",
            title=f"{key} is done",
            statement=f"{key}.txt says done {key}",
            check_spec=spec,
        )
        assertion.save()
        feature.assertions.add(assertion)
        if extra_check is not None:
            slow = ContractAssertion(
                milestone=milestone,
                key=f"VAL-{key}-extra",
                title=f"{key} extra",
                statement="the extra check holds",
                check_spec=extra_check,
            )
            slow.save()
            feature.assertions.add(slow)
    return slice_


def implement(repo, *keys: str, good: bool = True) -> str:
    """Commit `<key>.txt` for each key, right (`done <key>`) or wrong; returns the revision."""
    files = {f"{k}.txt": (f"done {k}\n" if good else f"not yet {k}\n") for k in keys}
    return repo.commit(files, f"implement {' '.join(keys)}")


def open_task(feature: MissionFeature) -> Task | None:
    return feature.tasks.filter(status__in=[TaskStatus.TODO, TaskStatus.IN_PROGRESS]).order_by("-id").first()


def feature(mission: Mission, key: str) -> MissionFeature:
    return MissionFeature.objects.get(mission=mission, key=key)


def events(mission: Mission, type: str | None = None) -> list[MissionEvent]:
    qs = MissionEvent.objects.filter(mission=mission).order_by("seq")
    return list(qs.filter(type=type) if type else qs)


def activated_slices(mission: Mission) -> list[str]:
    """Keys of the slices in the order the autopilot activated them (audit log order)."""
    by_id = dict(Slice.objects.filter(mission=mission).values_list("pk", "key"))
    return [by_id.get(e.payload["slice"], "?") for e in events(mission, "slice:activated")]


def assert_serial_history(mission: Mission) -> None:
    """Replay the audit log: when a slice is activated, every earlier activated slice has
    completed and every feature of it has passed — never two active slices at once."""
    slice_of = dict(MissionFeature.objects.filter(mission=mission).values_list("pk", "slice_id"))
    active: set[int] = set()
    loop: dict[int, str] = {}
    for event in events(mission):
        payload = event.payload
        if event.type == "feature:updated" and "loop_state" in payload and "feature" in payload:
            loop[payload["feature"]] = payload["loop_state"]
        elif event.type == "slice:activated":
            assert not active, f"slice {payload['slice']} activated while {active} still active (seq {event.seq})"
            active.add(payload["slice"])
        elif event.type == "slice:completed":
            sid = payload["slice"]
            assert sid in active, f"slice {sid} completed without being active (seq {event.seq})"
            unfinished = [f for f, s in slice_of.items() if s == sid and loop.get(f) != "passed"]
            assert not unfinished, f"slice {sid} completed with features {unfinished} not passed (seq {event.seq})"
            active.discard(sid)


def wait_for(predicate, timeout: float = 30, interval: float = 0.05, message: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {message}")


def python_command(script: Path, *args: str) -> str:
    return " ".join([sys.executable, str(script), *args])


def milestone_ready(*, milestone: Milestone) -> str:
    """`validation.services.milestones.milestone_ready` as the autopilot calls it: in a
    transaction that holds the mission's lock."""
    from django.db import transaction

    from missions.locks import lock_mission
    from validation.services import milestones

    with transaction.atomic():
        lock_mission(milestone.mission_id)
        return milestones.milestone_ready(milestone=milestone)
