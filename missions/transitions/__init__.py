"""The state machines of the plan (docs/ARCHITECTURE.md, "State machines"):
for each state field, its table as data and the one function that changes it. Services
call these; nothing else writes a state field (a row is created in its default state).

- `machine`: the engine — `Machine(name, model, field, table)` and `move` (legal pair,
  the mission's lock first, compare-and-swap on the old state, audit row, named event).
- `loop`: `MissionFeature.loop_state` (`feature_transition`, event `feature:updated`).
- `task`: `Task.status` (`task_transition`, `task:updated`).
- `mission`: `Mission.status` and the autopilot's `status_reason` (`mission_transition`,
  `mission:activated|paused|resumed|completed|reopened|halted|continued`).
- `milestone`: `Milestone.status` (`milestone_transition`,
  `milestone:activated|completed|reopened`) and `Milestone.validation_state`
  (`milestone_validation_transition`, `milestone:validation:updated`).
- `slice`: `Slice.status` (`slice_transition`, `slice:activated|completed|reopened`).
- `assertion`: `ContractAssertion.status` (`assertion_transition`, `assertion:judged`).
- `progress`: completing a milestone and reopening what a change undid, through the
  machines above.

Every event name is in the catalogue, `missions.event_catalogue.EVENT_TYPES`.
"""
