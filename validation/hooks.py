"""What the loop announces to the floor above it (docs/ARCHITECTURE.md, "Floors"): as
`missions/hooks.py` does for the plan, `validation` never imports `forges`; it sends these
Django signals and `forges` subscribes in its `AppConfig.ready` (`forges/receivers.py`)."""

from __future__ import annotations

from django.dispatch import Signal

# In the sweep's flow, `startup`: the recovery sweep runs (`services/recovery.py: recover`,
# docs/RELIABILITY.md). A receiver re-drives the work it keeps that a lost message left
# waiting, and answers a mapping of entries for the sweep's report.
recovery_sweep = Signal()
