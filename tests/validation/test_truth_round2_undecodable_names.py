"""A file name that is not UTF-8 never blocks a run (docs/TRUTH.md, "Which files were
protected"): paths are bytes end to end, from git's output to the restored snapshot, and
what a verdict shows escapes the undecodable bytes visibly (`\\xff`), so host validation
accepts it. Real runs over real git repositories, through admission.
"""

from __future__ import annotations

import os

import pytest

from fusion_site.repos.snapshots import snapshot
from missions.models import Mission, MissionFeature
from tests.validation.protected_runs import BASE_FILES, RIGHT, WRONG, judge_protected
from validation.models import RunStatus
from validation.replay import replay_run
from validation.verdict import AssertionVerdict, Evidence, FrozenContext, Verdict, file_evidence_exists, file_ref

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("idle_broker")]

CHECKS = [{"run": "python -m unittest -q tests.test_calc"}, {"file": "calc.py", "contains": "def add"}]
INSIDE = os.fsdecode(b"tests/\xff-mine.txt")  # under the protected folder
OUTSIDE = os.fsdecode(b"data/\xfe\xfd.bin")
KEPT = os.fsdecode(b"tests/fixture-\xfc.txt")  # a protected file of the base


def write(repo, rel: str, content: bytes) -> None:
    target = repo.path / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)


@pytest.fixture
def base(git_repo) -> str:
    write(git_repo, KEPT, b"fixture\n")
    return git_repo.commit(BASE_FILES)


def judged(build_mission, base: str, on_change: str = "fail"):
    fields = {"protected_paths": ["tests/**"], "base_revision": base, "on_protected_change": on_change}
    return judge_protected(build_mission, CHECKS, **fields)


@pytest.mark.parametrize(("calc", "status"), [(RIGHT, RunStatus.PASSED), (WRONG, RunStatus.FAILED)])
def test_undecodable_names_inside_and_outside_protected_paths_end_in_a_real_verdict(
    build_mission, git_repo, base, calc, status
):
    write(git_repo, INSIDE, b"my own notes\n")
    write(git_repo, OUTSIDE, b"\x00\xff")
    git_repo.commit({"calc.py": calc})
    run, verdicts = judged(build_mission, base)
    assert run.status == status, (run.status, run.error, verdicts)
    assert verdicts["VAL-1"]["verdict"] == ("pass" if calc == RIGHT else "fail")
    assert verdicts["VAL-2"]["verdict"] == "pass"
    # The added file was set aside, and the note names it with its byte escaped, visibly.
    note = "set aside 1 file the implementation added under protected paths: tests/\\xff-mine.txt"
    assert {"kind": "other", "text": note} in verdicts["VAL-1"]["evidence"]
    assert feature_state(run) != "blocked"
    assert replay_run(run.pk).ok  # the replay restores the same files and judges the same


def test_a_changed_protected_file_with_an_undecodable_name_is_named_and_restored(build_mission, git_repo, base):
    write(git_repo, KEPT, b"rewritten\n")
    git_repo.commit({"calc.py": RIGHT})
    run, verdicts = judged(build_mission, base)
    assert run.status == RunStatus.FAILED, (run.status, run.error)
    assert verdicts["VAL-1"]["message"] == "the implementation changed protected files: tests/fixture-\\xfc.txt"
    run, verdicts = judged_again(build_mission, base)
    assert run.status == RunStatus.PASSED, (run.status, run.error, verdicts)


def judged_again(build_mission, base: str):
    Mission.objects.all().delete()
    return judged(build_mission, base, on_change="restore")


def feature_state(run) -> str:
    return MissionFeature.objects.get(pk=run.feature_id).loop_state


def test_file_evidence_naming_an_undecodable_file_round_trips_through_host_validation(git_repo):
    write(git_repo, OUTSIDE, b"one\ntwo\n")
    revision = git_repo.commit()
    with snapshot(str(git_repo.path), revision) as root:
        ref = file_ref(OUTSIDE, 2)
        assert ref.isascii() and "\\udcfe" in ref
        cited = AssertionVerdict(key="VAL-1", verdict="pass", message="m", evidence=[Evidence(kind="file", text=ref)])
        verdict = Verdict(status="pass", assertions=[cited])
        assert file_evidence_exists(verdict, FrozenContext(keys=("VAL-1",), checkout=root)) == []
