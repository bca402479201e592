"""docs/GUIDE.md, followed as written: every `sh` block in order in one bash session, the
blocks a `guide:` comment announces written to their file or run with Python, against a
live `manage.py serve` (workers included) — so the guide cannot drift from the product.

What the guide claims a reader sees is asserted afterwards from the database: the
mission imported with its owner, one feature passed at once, one failed with the whole
expectation in its evidence and passed through its fix, the milestone validated without
the autopilot, the mission complete."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from missions.models import LoopState, MilestoneStatus, Mission, MissionStatus
from tests.conftest import GIT_ENV
from tests.mcp.conftest import ROOT
from validation.models import RunScope, RunStatus, ValidatorRun

GUIDE = ROOT / "docs" / "GUIDE.md"
FENCE = re.compile(r"(?:<!-- guide: (?P<directive>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.S | re.M)


def guide_script(text: str) -> str:
    """The bash script the guide's runnable blocks make, in their order."""
    parts = ["set -euo pipefail"]
    for number, block in enumerate(FENCE.finditer(text)):
        directive, lang, body = block["directive"], block["lang"], block["body"]
        end = f"GUIDE_BLOCK_{number}"
        if directive and directive.startswith("write "):
            parts.append(f"cat > \"{directive.removeprefix('write ').strip()}\" <<'{end}'\n{body}{end}")
        elif directive == "run python":
            parts.append(f"python - <<'{end}'\n{body}{end}")
        elif directive:
            raise AssertionError(f"docs/GUIDE.md: unknown guide directive {directive!r}")
        elif lang == "sh":
            parts.append(body)
    return "\n".join(parts) + "\n"


def test_the_guide_script_holds_every_step():
    script = guide_script(GUIDE.read_text())
    for step in ("import_mission", "/api/tasks/", "/complete/", "/validate/", "replay_run", "mcp.client"):
        assert step in script, f"docs/GUIDE.md runs no {step!r} step"


def test_a_new_user_follows_the_guide(serve, tmp_path):
    server = serve()
    env = {
        **server.env,
        **GIT_ENV,
        "FUSION": server.url,
        "PROJECT": str(tmp_path / "textstats"),
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    made = subprocess.run(
        [sys.executable, "manage.py", "ensure_admin"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr

    done = subprocess.run(
        ["bash", "-c", guide_script(GUIDE.read_text())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    assert done.returncode == 0, f"the guide stopped:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}\n{server.logs()}"

    mission = Mission.objects.get(key="textstats")
    assert mission.owner == get_user_model().objects.get(username="admin")
    assert mission.status == MissionStatus.COMPLETE and not mission.autopilot
    assert mission.milestones.get().status == MilestoneStatus.COMPLETE
    features = {f.key: f for f in mission.features.all()}
    assert set(features) == {"word-count", "top-words", "top-words-fix-1"}
    assert {f.loop_state for f in features.values()} == {LoopState.PASSED}
    assert "## Validation cause" in features["top-words-fix-1"].description

    failed = ValidatorRun.objects.get(feature=features["top-words"], status=RunStatus.FAILED)
    failure = failed.failures.get()
    assert failure.assertion_key == "VAL-TS-002"
    assert "python -m unittest tests.test_words.TopWords" in failure.expected
    assert "test_ties_in_alphabetical_order" in " ".join(e.get("text", "") for e in failure.evidence)
    milestone_run = ValidatorRun.objects.get(mission=mission, scope=RunScope.MILESTONE)
    assert milestone_run.status == RunStatus.PASSED
    assert {a["key"] for a in milestone_run.assertions} == {"VAL-TS-001", "VAL-TS-002", "VAL-TS-003"}

    out = done.stdout
    assert "loop_state: passed" in out
    assert "started\nstatus: complete" in out  # the milestone's validate, then its state
    assert "nothing to do: the mission is complete" in out  # the MCP client's answer
    assert re.search(r"^run \d+: reproduced", out, re.M), out  # replay_run of the failed run
