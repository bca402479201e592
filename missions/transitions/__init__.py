"""The state machines (docs/ARCHITECTURE.md, "State machines"): for each state field, its
table as data and the one function that changes it. Services call these; nothing else
writes a state field (a row is created in its default state).

- `tables`: every table, the validation floor's (`ValidatorRun.status`, `Review.state`)
  included, as data; `TRANSITIONS` names them for the docs (`manage.py transition_tables`).
- `machine`: the engine — `Machine(name, model, field, table)`; `Machine.allows` and
  `Machine.names` (what a state may become, for the services' guards); `move` (legal
  pair, the mission's lock first, compare-and-swap on the old state, audit row, named
  event).
- `moves`: the plan's machines and their functions (task, mission, milestone and its
  rollup state, slice, assertion).
- `loop`: `MissionFeature.loop_state` (`feature_transition`, event `feature:updated`).
- `progress`: completing a milestone and reopening what a change undid, through the
  machines above.

The validation floor binds its two tables to its models (`validation/services/run_state.py`,
`validation/review/state.py`) and moves them with the same engine. Every event name is in
the catalogue, `missions.event_catalogue.EVENT_TYPES`. The package exposes each machine (`TASK`,
`FEATURE`, ...) and its `*_transition` function.
"""

from missions.transitions.loop import FEATURE, feature_transition
from missions.transitions.moves import (
    ASSERTION,
    MILESTONE,
    MILESTONE_VALIDATION,
    MISSION,
    SLICE,
    TASK,
    assertion_transition,
    milestone_transition,
    milestone_validation_transition,
    mission_transition,
    slice_transition,
    task_transition,
)

__all__ = [
    "ASSERTION",
    "FEATURE",
    "MILESTONE",
    "MILESTONE_VALIDATION",
    "MISSION",
    "SLICE",
    "TASK",
    "assertion_transition",
    "feature_transition",
    "milestone_transition",
    "milestone_validation_transition",
    "mission_transition",
    "slice_transition",
    "task_transition",
]
