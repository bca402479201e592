"""The mission the sandbox tests judge: protected tests committed at the base, an
implementation of `add` on top, one run check per feature."""

from __future__ import annotations

import json

from missions.models import MissionEvent
from validation.models import JournalEntry, ValidatorRun

STUB = "def add(a, b):\n    raise NotImplementedError\n"
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"


def check_of(case: str) -> dict:
    return {"run": f"python -m pytest -q -s --tb=line -p no:cacheprovider tests/test_{case}.py"}


def protected_test(case: str) -> str:
    return f"from calc_{case} import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"


def run_texts(run: ValidatorRun) -> str:
    """Everything the service keeps of a run: its verdict, error, journal and events."""
    journal = JournalEntry.objects.filter(run=run).values_list("payload", flat=True)
    events = MissionEvent.objects.filter(mission_id=run.feature.mission_id).values_list("payload", flat=True)
    return json.dumps([run.verdict, run.error, run.blocked_reason, list(journal), list(events)], default=str)
