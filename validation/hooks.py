"""What the verdicts announce to the floor above them (docs/ARCHITECTURE.md, "Floors").

`validation` never imports `forges`. Where a run's start or end, or the recovery sweep,
concerns the floor above, it sends one of these Django signals and `forges` subscribes
in its `AppConfig.ready` (`forges/receivers.py`), as `validation` subscribes to
`missions/hooks.py`.
"""

from __future__ import annotations

from django.dispatch import Signal

# In the transaction, `run`: a run started (`runs.launch`). Whatever a receiver writes
# commits or rolls back with the run's start.
run_started = Signal()

# In the transaction, `run`: a run ended, whatever the end (a verdict, an error, a cancel,
# a reused pass: `runs.announce_completed`); `run.status` is the end. Whatever a receiver
# writes commits with the end.
run_ended = Signal()

# Outside any transaction, `now`, `startup`: the recovery sweep (`services/recovery.py:
# recover`, docs/RELIABILITY.md). A receiver re-drives the work it keeps that a lost
# message left waiting, and answers a mapping of entries for the sweep's report.
recovery_swept = Signal()
