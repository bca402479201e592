"""The sandbox's modes (fusion_site/runtime/sandbox.py): `required` without bubblewrap runs
nothing and blocks the feature; `auto` without it runs the checks and records so; a pass
obtained unconfined is judged again once the sandbox is there; the command validator runs
confined."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fusion_site.runtime import sandbox
from missions.models import Mission, MissionFeature
from tests.sandbox.mission import RIGHT, STUB, check_of, protected_test, run_texts
from validation.models import JournalEntry, RunStatus, ValidatorRun
from validation.services.verdicts.admit import feature_admit

pytestmark = pytest.mark.django_db(transaction=True)


def one_feature(build_mission, git_repo) -> MissionFeature:
    base = git_repo.commit(
        {"tests/__init__.py": "", "tests/test_calc.py": protected_test("calc")} | {"calc_calc.py": STUB}
    )
    git_repo.commit({"calc_calc.py": RIGHT}, "implementation")
    mission = build_mission({"calc": [("VAL-1", check_of("calc"))]}, validator="checks")
    Mission.objects.filter(pk=mission.pk).update(protected_paths=["tests/**"], base_revision=base)
    return MissionFeature.objects.get(key="calc")


class NoBubblewrap:
    """This process's PATH with every folder holding `bwrap` replaced by one of links to
    all its other programs: the sandbox's probe (`shutil.which`) finds none, for real. The
    probe's cache is cleared on both sides."""

    def __init__(self, tmp_path: Path, monkeypatch):
        self.monkeypatch, self.original = monkeypatch, os.environ["PATH"]
        path = []
        for i, folder in enumerate(self.original.split(os.pathsep)):
            if not (Path(folder) / "bwrap").exists():
                path.append(folder)
                continue
            links = tmp_path / f"bin-without-bwrap-{i}"
            links.mkdir()
            for program in Path(folder).iterdir():
                if program.name != "bwrap":
                    (links / program.name).symlink_to(program)
            path.append(str(links))
        monkeypatch.setenv("PATH", os.pathsep.join(path))
        self.clear()

    @staticmethod
    def clear() -> None:
        sandbox._probe.cache_clear()
        sandbox.overlay_works.cache_clear()

    def restore(self) -> None:
        self.monkeypatch.setenv("PATH", self.original)
        self.clear()


@pytest.fixture
def no_bubblewrap(tmp_path, monkeypatch):
    gone = NoBubblewrap(tmp_path, monkeypatch)
    assert shutil.which("bwrap") is None and not sandbox.status().confined
    yield gone
    gone.restore()


def admit(feature: MissionFeature) -> str:
    return feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").outcome


def test_required_without_bubblewrap_runs_nothing_and_blocks_the_feature(
    no_bubblewrap, settings, worker, build_mission, git_repo
):
    settings.FUSION_SANDBOX = "required"
    feature = one_feature(build_mission, git_repo)
    assert admit(feature) == "started"
    worker.drain()
    run = ValidatorRun.objects.get(feature=feature)
    feature.refresh_from_db()
    assert run.status == RunStatus.ERROR and "no sandbox works here" in run.error, run.error
    assert run.sandbox.startswith("none (bubblewrap is not installed")
    assert not JournalEntry.objects.filter(run=run, kind="check").exists()
    assert feature.loop_state == "blocked" and feature.stop_reason == "sandbox_unavailable"


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_a_pass_obtained_unsandboxed_is_judged_again_once_the_sandbox_is_there(
    mode, no_bubblewrap, settings, worker, build_mission, git_repo
):
    settings.FUSION_SANDBOX = "auto"
    feature = one_feature(build_mission, git_repo)
    assert admit(feature) == "started"
    worker.drain()
    unconfined = ValidatorRun.objects.get(feature=feature)
    assert unconfined.status == RunStatus.PASSED, unconfined.error
    assert unconfined.sandbox == "none (bubblewrap is not installed (Debian: apt install bubblewrap))"
    assert admit(feature) == "reused"  # the same input, unconfined again: the pass holds

    no_bubblewrap.restore()  # bubblewrap is installed again
    settings.FUSION_SANDBOX = mode
    assert admit(feature) == "started"
    worker.drain()
    confined = ValidatorRun.objects.filter(feature=feature).latest("id")
    assert confined.status == RunStatus.PASSED and confined.reused_from is None, confined.error
    assert confined.sandbox == sandbox.status().record and confined.sandbox.startswith("bubblewrap")
    assert admit(feature) == "reused"  # a pass obtained confined holds, whatever the mode
    assert ValidatorRun.objects.filter(feature=feature).latest("id").reused_from_id == confined.pk


# ------------------------------------------------------------------ the command validator

VALIDATOR = """import json, pathlib, sys
sys.stdin.read()
seen = []
try:
    pathlib.Path({secret!r}).read_bytes()
    seen.append("secret: READ")
except OSError as exc:
    seen.append("secret: unreadable " + type(exc).__name__)
try:
    pathlib.Path({data!r}, "escaped-by-validator.txt").write_text("escaped")
    seen.append("data: WRITTEN")
except OSError as exc:
    seen.append("data: unwritable " + type(exc).__name__)
pathlib.Path("validator-note.txt").write_text("mine")
seen.append("own copy: " + pathlib.Path("validator-note.txt").read_text())
note = "; ".join(seen)
print(json.dumps({{"status": "pass", "summary": note, "blocked_reason": "", "assertions": [{{"key": "VAL-1",
    "verdict": "pass", "message": note, "expected": "", "actual": "",
    "evidence": [{{"kind": "other", "text": note}}]}}]}}))
"""


def test_the_command_validator_runs_confined(bubblewrap, settings, worker, build_mission, git_repo, tmp_path):
    secret_file = Path(settings.DATA_DIR, "secret_key")
    script = tmp_path / "validator" / "validator.py"
    script.parent.mkdir()
    script.write_text(VALIDATOR.format(secret=str(secret_file), data=str(settings.DATA_DIR)))
    command = [str(sandbox.check_interpreter()), str(script)]
    settings.FUSION_VALIDATORS = {"cmd": {"kind": "command", "command": command, "network": False}}
    git_repo.commit({"calc.py": RIGHT}, "implementation")
    build_mission({"calc": [("VAL-1", None)]}, validator="cmd")
    feature = MissionFeature.objects.get(key="calc")
    assert admit(feature) == "started"
    worker.drain()
    run = ValidatorRun.objects.get(feature=feature)
    assert run.status == RunStatus.PASSED and run.sandbox.startswith("bubblewrap"), run.error
    note = run.verdict["assertions"][0]["message"]
    assert note == "secret: unreadable FileNotFoundError; data: unwritable FileNotFoundError; own copy: mine"
    assert not Path(settings.DATA_DIR, "escaped-by-validator.txt").exists()
    secret = secret_file.read_text().strip()
    assert secret not in run_texts(run) and secret.encode().hex() not in run_texts(run)
