"""Late-bound steps inside the validation floor (docs/ARCHITECTURE.md, "Floors").

Judging is recursive: an admission may reuse an identical pass, a pass may close a fix
lineage, and closing it re-admits the root. Admission sends `pass_reused` and the
outcome rules, which sit above it, subscribe in `ValidationConfig.ready`
(`validation/receivers.py`), so the modules keep one import direction. Sent inside the
caller's transaction.
"""

from __future__ import annotations

from django.dispatch import Signal

# `feature`, `run` (the new, already passed run), `old_state`: apply a reused pass.
pass_reused = Signal()
