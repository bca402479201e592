"""From a completed task to its verdict, one module a step, read in this order
(docs/ARCHITECTURE.md, "The walk of a task completion"):

1. `task.py`: a completed task's guards (`task_outcome_process`);
2. `admit.py`: admission under the feature's lock (`admit`, `admit_or_raise`, `rerun`):
   a run starts, an identical pass is reused (`apply_pass`), or the feature is blocked;
3. `start.py`: the run is made, the feature is `validating`, the run is handed to the
   runner after commit (`start_run`);
4. `validation/services/runner.py`: the `run_validator` actor judges it (`execute_run`);
5. `complete.py`: the verdict or the error is recorded (`run_complete`, `run_error`) and
   the feature moves;
6. `complete.py`'s follow-ups, each in a savepoint (`follow_up.follow_up`): a fix, a newer
   revision judged, a milestone run's consequences, the autopilot; a pass's follow-ups are
   `admit.apply_pass`'s (a fix's root judged again, its lineage closed).

What a run judges is `validation/services/run_input.py`; a run's row and its events,
`validation/services/runs.py`.
"""
