"""From a completed task to its verdict, in the order a newcomer reads it
(docs/ARCHITECTURE.md, "The walk of a task completion"):

1. `task.py`: a completed task's guards (`task_outcome_process`), then
2. `admit.py`: admission under the feature's lock (`admit`, `admit_or_raise`, `rerun`):
   a run starts (`start_run`, which hands it to the runner after commit), an identical
   pass is reused (`apply_pass`), or the feature is blocked;
3. `validation/services/runner.py: execute_run` judges the run (the `run_validator` actor);
4. `complete.py`: the verdict or the error is recorded (`run_complete`, `run_error`), the
   feature moves, and
5. `complete.py`'s follow-ups: a fix, a newer revision or a root judged again, a milestone
   run's consequences, the autopilot, each in a savepoint (`follow_up.follow_up`).

What a run judges is `validation/services/run_input.py`; how a run's row and its events
are made, `validation/services/runs.py`.
"""
