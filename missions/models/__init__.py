"""Mission -> Milestone -> Slice -> Feature, contract assertions, tasks, the audit log.

States change only through the machines (`missions.transitions`, called by
`missions.services.*`); the models hold data and the invariants the database can enforce.
"""

from __future__ import annotations

from missions.models.base import TimeStamped, column

# One module per part of the model; every name is importable from `missions.models`.
from missions.models.plan import (
    AssertionScope,
    AssertionStatus,
    ContractAssertion,
    Executor,
    FeatureAssertion,
    FeatureStatus,
    LoopState,
    Milestone,
    MilestoneStatus,
    Mission,
    MissionFeature,
    MissionStatus,
    ProtectedChange,
    RollupState,
    Slice,
    SliceStatus,
    StopReason,
)
from missions.models.work import MissionEvent, Task, TaskStatus

__all__ = [
    "TimeStamped",
    "column",
    "AssertionScope",
    "AssertionStatus",
    "ContractAssertion",
    "Executor",
    "MissionFeature",
    "FeatureAssertion",
    "FeatureStatus",
    "LoopState",
    "Milestone",
    "MilestoneStatus",
    "Mission",
    "MissionEvent",
    "MissionStatus",
    "ProtectedChange",
    "RollupState",
    "Slice",
    "SliceStatus",
    "StopReason",
    "Task",
    "TaskStatus",
]
