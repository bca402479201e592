"""What the plan announces to the floor above it (docs/ARCHITECTURE.md, "Floors").

`missions` never imports `validation`. Where a change of the plan must start judging
work, it sends one of these Django signals and `validation` subscribes to them in its
`AppConfig.ready` (`validation/receivers.py`). Signals marked "after commit" are sent by
`announce_on_commit`, so a receiver may enqueue work directly; the others are sent inside
the caller's transaction, so whatever a receiver writes commits or rolls back with it.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.dispatch import Signal

# After commit, `task_id`: a task landed a revision; its outcome is to be judged.
task_completed = Signal()

# After commit, `mission_id`: the mission became active, was reopened or had its
# autopilot switched on; the autopilot should look at it again.
mission_may_advance = Signal()

# In the transaction, `milestone_ids`, `cause`: an assertion was created, edited, linked,
# unlinked or deleted; passed features whose contract changed must be judged again.
contract_changed = Signal()

# A question, in the caller's flow, `source`, `commit`, `patterns`: which protected path
# patterns match no file of the commit (how a pattern matches is the validation floor's,
# `validation/protect.py`). The receiver answers with that list; a `SnapshotError` when
# the commit cannot be read.
protected_paths_unmatched = Signal()


# In the transaction, `mission`, `forge`, `user`: a mission file was imported; `forge` is
# its `forge:` section's values (None when the file has none: the stored forge is left
# alone). The receiver (`forges/receivers.py`) writes the mission's forge and answers
# whether it changed anything; a refusal it raises (an `Invalid` or `Forbidden` naming
# the file's paths) rolls the whole import back.
mission_file_imported = Signal()

# A question, in the caller's flow, `mission`: the sections the floors above keep in the
# mission's file (`{"forge": {…}}`), for its export. Each receiver answers a mapping of
# section names to their values, or None.
mission_file_sections = Signal()


def announce_on_commit(signal: Signal, **kwargs: Any) -> None:
    transaction.on_commit(lambda: signal.send(sender=None, **kwargs))
