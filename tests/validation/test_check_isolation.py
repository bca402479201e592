"""Checks do not disturb each other: every check sees the revision and nothing else.

In the sandbox (docs/SANDBOX.md) each `run` check runs over the pristine snapshot with a
private writable layer that vanishes with it. Without it (`FUSION_SANDBOX=off`, or no
overlay here) each `run` check runs in its own private copy of the snapshot, removed
afterwards; file checks read the snapshot itself. The one exception: a `checks` run with
a single run check judges its file checks (and their file evidence) first, then runs
that check in the snapshot itself, the tree's last reader. Real runs (admission, then
`execute_run`) over real git repositories.
"""

from __future__ import annotations

import json
import stat
import tempfile
from pathlib import Path

import pytest

from fusion_site.repos.snapshots import SNAPSHOT_NAME, private_copy, snapshot, snapshot_root, sweep_snapshots
from fusion_site.runtime import sandbox
from missions.models import MissionFeature
from validation.models import JournalEntry, RunStatus
from validation.services import runner
from validation.services.verdicts.admit import feature_admit
from validation.verdict import AssertionVerdict, Evidence, FrozenContext, Verdict, file_evidence_exists, file_refs_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("idle_broker")]

DELETES = {"run": "python -c \"import os; os.remove('data.txt')\""}  # fails when data.txt is already gone


def judged(build_mission, git_repo, checks: list[dict], files: dict[str, str] | None = None):
    """Run the `checks` (VAL-1, VAL-2, ...) of one feature at a new commit; (run, verdicts by key)."""
    git_repo.commit(files or {"data.txt": "payload\n"})
    build_mission({"iso": [(f"VAL-{i}", check) for i, check in enumerate(checks, 1)]})
    run = feature_admit(feature_id=MissionFeature.objects.get(key="iso").pk, trigger="manual", cause="validate").run
    runner.execute_run(run.pk)
    run.refresh_from_db()
    assert run.verdict is not None, run.error
    return run, {a["key"]: a for a in run.verdict["assertions"]}


def test_a_run_check_that_deletes_a_file_leaves_it_to_the_others(build_mission, git_repo, settings):
    settings.FUSION_CHECK_PARALLELISM = 4
    run, verdicts = judged(
        build_mission,
        git_repo,
        [
            DELETES,
            DELETES,
            DELETES,
            {"file": "data.txt", "exists": True},
            {"file": "data.txt", "contains": "^payload$"},
        ],
    )
    assert {key: v["verdict"] for key, v in verdicts.items()} == dict.fromkeys(verdicts, "pass"), verdicts
    assert run.status == RunStatus.PASSED


def test_a_file_a_run_check_generates_is_not_in_the_revision(build_mission, git_repo, settings):
    settings.FUSION_CHECK_PARALLELISM = 1
    generate = {"run": "python -c \"open('gen.txt', 'w').write('made by a check')\""}
    run, verdicts = judged(
        build_mission, git_repo, [generate, {"file": "gen.txt", "exists": True}, {"file": "gen.txt", "exists": False}]
    )
    assert [verdicts[k]["verdict"] for k in ("VAL-1", "VAL-2", "VAL-3")] == ["pass", "fail", "pass"]
    assert verdicts["VAL-2"]["actual"] == "gen.txt does not exist"
    assert run.status == RunStatus.FAILED


def test_a_check_cannot_change_a_file_in_place_for_the_others(build_mission, git_repo, settings):
    settings.FUSION_CHECK_PARALLELISM = 1
    overwrite = {"run": "chmod u+w data.txt && echo changed > data.txt", "shell": True}
    run, verdicts = judged(
        build_mission,
        git_repo,
        [overwrite, {"file": "data.txt", "contains": "^payload$"}, {"run": "grep -qx payload data.txt"}],
    )
    assert [verdicts[k]["verdict"] for k in ("VAL-1", "VAL-2", "VAL-3")] == ["pass", "pass", "pass"], verdicts
    assert run.status == RunStatus.PASSED


@pytest.fixture
def seen(monkeypatch) -> list[Path]:
    """The checkout each judgement was given (the run's snapshot), in order."""
    checkouts: list[Path] = []
    real_judge = runner.judge

    def spying(ctx):
        checkouts.append(ctx.checkout)
        return real_judge(ctx)

    monkeypatch.setattr(runner, "judge", spying)
    return checkouts


def test_in_the_sandbox_each_run_check_writes_a_layer_of_its_own_over_the_snapshot_and_none_is_left(
    build_mission, git_repo, settings, seen
):
    if not sandbox.layers_work():
        pytest.fail("bubblewrap with overlays is required for this test (docs/SANDBOX.md): apt install bubblewrap")
    settings.FUSION_CHECK_PARALLELISM = 4
    layers_before = set(Path(tempfile.gettempdir()).glob("fusion-layer-*"))
    checks = [
        {"run": "python -c \"import os; print(os.getcwd()); open('mine.txt', 'w').write('1')\""},
        {"run": "sh -c 'echo changed > data.txt; test ! -e mine.txt; sleep 30'", "timeout": 1},
        {"run": "grep -qx payload data.txt"},
        {"file": "data.txt", "contains": "^payload$"},
        {"file": "mine.txt", "exists": False},
    ]
    run, verdicts = judged(build_mission, git_repo, checks)
    assert [verdicts[k]["verdict"] for k in ("VAL-1", "VAL-2", "VAL-3", "VAL-4", "VAL-5")] == [
        "pass", "fail", "pass", "pass", "pass"
    ], verdicts  # fmt: skip
    assert "timed out" in verdicts["VAL-2"]["actual"]
    printed = Path(verdicts["VAL-1"]["evidence"][0]["text"].splitlines()[1])
    assert printed == seen[0], "no copy: the check's tree is the snapshot, under its own layer"
    assert run.sandbox.startswith("bubblewrap")
    # Only this run's layers count: another process's may come and go in the same folder.
    left = set(Path(tempfile.gettempdir()).glob("fusion-layer-*")) - layers_before
    assert left == set(), "a layer was left behind"
    assert sorted(snapshot_root().iterdir()) == [], "the snapshot was left behind"


def test_each_run_check_gets_its_own_copy_and_none_is_left_even_after_a_timeout(
    build_mission, git_repo, settings, seen, tmp_path
):
    # Unsandboxed (the fallback where no overlay works): the check writes a host file.
    settings.FUSION_SANDBOX = "off"
    settings.FUSION_CHECK_PARALLELISM = 4
    hang = tmp_path / "hanging-cwd"
    checks = [
        {"run": 'python -c "import os; print(os.getcwd())"'},
        {
            "run": f"python -c \"import os, time; open({str(hang)!r}, 'w').write(os.getcwd()); time.sleep(30)\"",
            "timeout": 1,
        },
        # A folder its copy cannot list any more: the copy is removed all the same.
        {
            "run": "mkdir -p locked/inner && touch locked/inner/f && chmod 000 locked/inner && chmod 500 locked",
            "shell": True,
        },
        {"file": "data.txt", "exists": True},
    ]
    run, verdicts = judged(build_mission, git_repo, checks)
    assert [verdicts[k]["verdict"] for k in ("VAL-1", "VAL-2", "VAL-3", "VAL-4")] == ["pass", "fail", "pass", "pass"]
    assert "timed out" in verdicts["VAL-2"]["actual"]
    printed = Path(verdicts["VAL-1"]["evidence"][0]["text"].splitlines()[1])
    copies = {printed, Path(hang.read_text())}
    assert len(copies) == 2 and seen[0] not in copies, "each run check runs in a copy of its own"
    assert all(SNAPSHOT_NAME.match(c.name).group(1) == f"run-{run.pk}" and c.parent == snapshot_root() for c in copies)
    assert sorted(snapshot_root().iterdir()) == [], "a private copy or the snapshot was left behind"


def test_a_lone_run_check_runs_in_the_snapshot_after_the_file_checks_and_their_evidence(
    build_mission, git_repo, settings, seen
):
    settings.FUSION_CHECK_PARALLELISM = 4  # sandboxed or not, the lone check's tree is the snapshot
    # Listed first, and it deletes the file the file check cites and judges.
    wreck = {"run": "python -c \"import os; os.remove('data.txt'); print(os.getcwd())\""}
    run, verdicts = judged(build_mission, git_repo, [wreck, {"file": "data.txt", "contains": "^payload$"}])
    assert run.status == RunStatus.PASSED, verdicts  # the file evidence was judged before the deletion
    assert verdicts["VAL-2"]["evidence"][0] == {"kind": "file", "text": "data.txt:1"}
    assert Path(verdicts["VAL-1"]["evidence"][0]["text"].splitlines()[1]) == seen[0], "no copy: the snapshot itself"
    order = list(JournalEntry.objects.filter(run_id=run.pk, kind="check").order_by("seq").values_list("key", flat=True))
    assert order == ["VAL-2", "VAL-1"], "the file check is judged before the run check starts"
    assert sorted(snapshot_root().iterdir()) == [], "the snapshot was left behind"


def test_the_journal_holds_what_each_check_saw(build_mission, git_repo, settings):
    settings.FUSION_CHECK_PARALLELISM = 4
    run, verdicts = judged(build_mission, git_repo, [DELETES, DELETES])
    entries = JournalEntry.objects.filter(run_id=run.pk, kind="check").order_by("key")
    assert [json.dumps(e.payload["result"], sort_keys=True) for e in entries] == [
        json.dumps(verdicts[k], sort_keys=True) for k in ("VAL-1", "VAL-2")
    ]


@pytest.mark.parametrize("parent", ["snapshots", ".gitcache/snapshots"])
def test_files_under_dot_github_are_read_only_in_the_snapshot(git_repo, settings, tmp_path, parent):
    settings.FUSION_SNAPSHOT_DIR = tmp_path / parent  # a `.git` in the folder's own path is not git's either
    rev = git_repo.commit({".github/workflows/ci.yml": "on: push\n", ".gitlab/ci.yml": "x\n", "src/a.py": "A = 1\n"})
    with snapshot(str(git_repo.path), rev) as root:
        for rel in (".github/workflows/ci.yml", ".gitlab/ci.yml", "src/a.py"):
            mode = (root / rel).stat().st_mode
            assert not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), f"{rel} is writable"
        assert (root / ".github/workflows").stat().st_mode & stat.S_IWUSR, "folders stay writable"


def test_a_private_copy_is_named_like_its_snapshot_and_swept_with_it(git_repo):
    rev = git_repo.commit({"data.txt": "payload\n"})
    with snapshot(str(git_repo.path), rev, label="run-7") as root, private_copy(root) as copy:
        assert SNAPSHOT_NAME.match(copy.name).group(1) == "run-7"
        assert (copy / "data.txt").read_text() == "payload\n"
        assert not (copy / "data.txt").stat().st_mode & stat.S_IWUSR
        assert sweep_snapshots(live_labels=lambda: {"run-7"}) == 0 and copy.exists()
        assert sweep_snapshots(live_labels=set) == 2 and not copy.exists()
    assert sorted(snapshot_root().iterdir()) == []


def test_host_validation_reads_the_file_references_judged_before_a_check_ran(tmp_path):
    (tmp_path / "kept.txt").write_text("one\ntwo\n")
    cite = AssertionVerdict(
        key="VAL-1", verdict="pass", message="m", evidence=[Evidence(kind="file", text="kept.txt:2")]
    )
    refs = file_refs_of([cite], tmp_path)
    assert refs == {"kept.txt:2": None}
    (tmp_path / "kept.txt").unlink()  # what the check in the snapshot did afterwards
    verdict = Verdict(status="pass", assertions=[cite])
    assert file_evidence_exists(verdict, FrozenContext(keys=("VAL-1",), checkout=tmp_path, file_refs=refs)) == []
    assert file_evidence_exists(verdict, FrozenContext(keys=("VAL-1",), checkout=tmp_path)) != []  # the disk now
    later = verdict.model_copy(
        update={"assertions": [cite.model_copy(update={"evidence": [Evidence(kind="file", text="new.txt:1")]})]}
    )
    (tmp_path / "new.txt").write_text("made by the check\n")
    problems = file_evidence_exists(later, FrozenContext(keys=("VAL-1",), checkout=tmp_path, file_refs=refs))
    assert problems == ["VAL-1: file evidence 'new.txt:1' was not read before a check ran"]
