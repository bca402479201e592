"""A check that reads a submodule the snapshot left empty, or a Git LFS pointer instead of
its content, is blocked with what to enable, never judged on what is not there; with
`submodules: true` the judged commit's submodules are in the snapshot, fetched through
the mirror cache under the repository rules (docs/TRUTH.md, docs/REPOSITORIES.md)."""

from __future__ import annotations

import os
import stat

import pytest

from fusion_site.repos import mirrors
from fusion_site.repos.snapshots import snapshot, snapshot_root, sweep_snapshots
from fusion_site.repos.sources import normalize
from missions.models import LoopState, Mission, MissionFeature, StopReason
from tests.conftest import Repo
from tests.gitserver import GitDaemon
from validation.models import RunStatus, ValidatorRun
from validation.services.runner import execute_run
from validation.services.verdicts.admit import feature_admit

pytestmark = pytest.mark.django_db(transaction=True)

POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    "size 12345\n"
)


def _repo(path, files: dict[str, str]) -> Repo:
    path.mkdir()
    repo = Repo(path)
    repo.git("init", "-q", "-b", "main")
    repo.commit(files, "initial")
    return repo


@pytest.fixture
def with_lib(git_repo, tmp_path, settings):
    """`git_repo` with a submodule `vendor/lib` (URL `../lib`, as `git submodule add`
    writes it), whose `data.txt` says the answer; local repositories inside the roots."""
    settings.FUSION_WORKSPACE_ROOTS = [str(tmp_path)]
    lib = _repo(tmp_path / "lib", {"data.txt": "answer = 42\n"})
    git_repo.git("-c", "protocol.file.allow=always", "submodule", "add", "-q", "../lib", "vendor/lib")
    git_repo.commit({"app.py": "print(open('vendor/lib/data.txt').read())\n"}, "add lib")
    return lib


def _judge(mission: Mission) -> tuple[ValidatorRun, MissionFeature]:
    feature = MissionFeature.objects.get(mission=mission, key="f")
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    execute_run(run.pk)
    run.refresh_from_db()
    feature.refresh_from_db()
    return run, feature


def _verdicts(run: ValidatorRun) -> dict[str, dict]:
    return {a["key"]: a for a in run.verdict["assertions"]}


def test_a_file_in_a_submodule_that_is_not_checked_out_blocks_with_submodule_not_fetched(build_mission, with_lib):
    mission = build_mission({"f": [("VAL-lib", {"file": "vendor/lib/data.txt", "contains": "answer = 42"})]})
    run, feature = _judge(mission)
    assert run.status == RunStatus.BLOCKED, run.verdict
    verdict = _verdicts(run)["VAL-lib"]
    assert verdict["verdict"] == "blocked"
    assert verdict["message"].startswith("submodule_not_fetched: vendor/lib/data.txt lies in submodule vendor/lib")
    assert "submodules: true" in verdict["message"]
    assert feature.loop_state == LoopState.BLOCKED
    assert feature.stop_reason == StopReason.SUBMODULE_NOT_FETCHED
    assert "submodules: true" in feature.stop_detail


def test_with_submodules_the_check_reads_the_submodules_content(build_mission, with_lib):
    mission = build_mission(
        {
            "f": [
                ("VAL-file", {"file": "vendor/lib/data.txt", "contains": "^answer = 42$"}),
                ("VAL-run", {"run": "python app.py", "expect_output": "answer = 42"}),
            ]
        }
    )
    Mission.objects.filter(pk=mission.pk).update(submodules=True)
    run, feature = _judge(mission)
    assert run.status == RunStatus.PASSED, run.verdict
    assert feature.loop_state == LoopState.PASSED


def test_with_submodules_wrong_content_in_the_submodule_fails(build_mission, with_lib):
    mission = build_mission({"f": [("VAL-file", {"file": "vendor/lib/data.txt", "contains": "^answer = 41$"})]})
    Mission.objects.filter(pk=mission.pk).update(submodules=True)
    run, _feature = _judge(mission)
    assert run.status == RunStatus.FAILED, run.verdict
    assert _verdicts(run)["VAL-file"]["actual"] == "no match"


def test_the_submodule_is_read_at_its_gitlink_commit_as_read_only_files_without_git(git_repo, with_lib, tmp_path):
    # The submodule's branch moves on after the superproject recorded it: the snapshot
    # holds the recorded commit, not the branch's newest.
    with_lib.commit({"data.txt": "answer = 43\n"}, "later")
    commit = git_repo.git("rev-parse", "HEAD").strip()
    with snapshot(str(git_repo.path), commit, submodules=True) as root:
        data = root / "vendor" / "lib" / "data.txt"
        assert data.read_text() == "answer = 42\n"
        assert not os.access(data, os.W_OK) or os.geteuid() == 0
        assert not stat.S_IMODE(data.stat().st_mode) & 0o222
        assert not (root / "vendor" / "lib" / ".git").exists()
        assert not (root / ".git").exists()
    assert not any((tmp_path / "snapshots").iterdir()), "the snapshot and its index files are removed"


def test_nested_submodules_are_checked_out(build_mission, git_repo, tmp_path, settings):
    settings.FUSION_WORKSPACE_ROOTS = [str(tmp_path)]
    _repo(tmp_path / "inner", {"deep.txt": "deep\n"})
    middle = _repo(tmp_path / "middle", {"m.txt": "m\n"})
    middle.git("-c", "protocol.file.allow=always", "submodule", "add", "-q", "../inner", "inner")
    middle.commit(message="add inner")
    git_repo.git("-c", "protocol.file.allow=always", "submodule", "add", "-q", "../middle", "middle")
    git_repo.commit(message="add middle")
    mission = build_mission({"f": [("VAL-deep", {"file": "middle/inner/deep.txt", "contains": "^deep$"})]})
    Mission.objects.filter(pk=mission.pk).update(submodules=True)
    run, _feature = _judge(mission)
    assert run.status == RunStatus.PASSED, run.verdict


def test_a_failing_run_check_on_a_tree_with_an_empty_submodule_is_blocked_a_passing_one_stands(build_mission, with_lib):
    mission = build_mission(
        {
            "f": [
                ("VAL-reads", {"run": "python app.py"}),
                ("VAL-other", {"run": "python -c \"print('ok')\""}),
            ]
        }
    )
    run, feature = _judge(mission)
    verdicts = _verdicts(run)
    assert verdicts["VAL-other"]["verdict"] == "pass"
    assert verdicts["VAL-reads"]["verdict"] == "blocked"
    assert verdicts["VAL-reads"]["message"].startswith("submodule_not_fetched: the commit's submodules vendor/lib")
    assert feature.stop_reason == StopReason.SUBMODULE_NOT_FETCHED


def _gitlink(repo: Repo, path: str, url: str, commit: str = "") -> None:
    """A submodule entry written by hand: any `.gitmodules` URL a pusher chooses."""
    commit = commit or repo.git("rev-parse", "HEAD").strip()
    repo.write(".gitmodules", f'[submodule "x"]\n\tpath = {path}\n\turl = {url}\n')
    repo.git("add", ".gitmodules")
    repo.git("update-index", "--add", "--cacheinfo", f"160000,{commit},{path}")
    repo.git("commit", "-q", "-m", "gitlink")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ext::sh", "remote helpers"),
        ("/etc", "must lie inside FUSION_WORKSPACE_ROOTS"),
        ("http://example.invalid/x.git", "scheme http://"),
    ],
)
def test_a_submodule_url_the_repository_rules_refuse_ends_the_run_with_the_reason(
    build_mission, git_repo, tmp_path, settings, url, reason
):
    settings.FUSION_WORKSPACE_ROOTS = [str(tmp_path)]
    _gitlink(git_repo, "dep", url)
    mission = build_mission({"f": [("VAL-dep", {"file": "dep/x", "exists": True})]})
    Mission.objects.filter(pk=mission.pk).update(submodules=True)
    run, feature = _judge(mission)
    assert run.status == RunStatus.ERROR
    assert run.error.startswith("workspace_refused: submodule dep: ")
    assert reason in run.error
    assert feature.loop_state == LoopState.BLOCKED  # refused for good: no retry
    assert feature.stop_reason == StopReason.WORKSPACE_UNAVAILABLE


def test_a_submodule_that_cannot_be_fetched_is_unavailability_retried(build_mission, git_repo, tmp_path, settings):
    settings.FUSION_WORKSPACE_ROOTS = [str(tmp_path)]
    _gitlink(git_repo, "dep", "../missing")
    mission = build_mission({"f": [("VAL-dep", {"file": "dep/x", "exists": True})]})
    Mission.objects.filter(pk=mission.pk).update(submodules=True)
    run, feature = _judge(mission)
    assert run.status == RunStatus.ERROR
    assert run.error.startswith("workspace_unavailable: submodule dep: ")
    assert str(tmp_path / "missing") in run.error
    assert feature.loop_state == LoopState.VALIDATING  # retried like any unavailability
    assert feature.last_run_id != run.pk


def test_an_lfs_pointer_read_by_a_file_check_blocks_with_lfs_not_fetched(build_mission, git_repo):
    git_repo.commit({"assets/model.bin": POINTER, ".gitattributes": "*.bin filter=lfs diff=lfs merge=lfs -text\n"})
    mission = build_mission(
        {
            "f": [
                ("VAL-content", {"file": "assets/model.bin", "contains": "weights"}),
                ("VAL-absent", {"file": "assets/model.bin", "not_contains": "TODO"}),
                ("VAL-exists", {"file": "assets/model.bin", "exists": True}),
            ]
        }
    )
    run, feature = _judge(mission)
    verdicts = _verdicts(run)
    assert run.status == RunStatus.BLOCKED, run.verdict
    assert verdicts["VAL-content"]["verdict"] == "blocked"
    assert verdicts["VAL-content"]["message"].startswith("lfs_not_fetched: assets/model.bin is a Git LFS pointer")
    assert verdicts["VAL-absent"]["verdict"] == "blocked"  # never a pass on the pointer's text
    assert verdicts["VAL-exists"]["verdict"] == "pass"  # the pointer is the committed file: it exists
    assert feature.stop_reason == StopReason.LFS_NOT_FETCHED


FORGE = f"python -c \"open('fake.bin', 'w').write({POINTER!r}); raise SystemExit(1)\""


def test_a_failing_run_check_on_a_tree_with_an_lfs_pointer_is_blocked(build_mission, git_repo):
    git_repo.commit({"assets/model.bin": POINTER})
    mission = build_mission({"f": [("VAL-run", {"run": FORGE}), ("VAL-ok", {"run": "python -c pass"})]})
    run, feature = _judge(mission)
    verdicts = _verdicts(run)
    assert verdicts["VAL-run"]["verdict"] == "blocked", run.verdict
    assert verdicts["VAL-run"]["message"].startswith("lfs_not_fetched: the commit's files assets/model.bin are")
    assert verdicts["VAL-ok"]["verdict"] == "pass"
    assert feature.stop_reason == StopReason.LFS_NOT_FETCHED


def test_a_pointer_a_check_writes_itself_does_not_turn_its_fail_into_a_block(build_mission, git_repo):
    # The lone run check runs in the snapshot itself: it turns a committed file into a
    # pointer before failing. What counts is the commit, not what the check left.
    rewrite = (
        "python -c \"import os; os.chmod('README.md', 0o644); "
        f"open('README.md', 'w').write({POINTER!r}); raise SystemExit(1)\""
    )
    mission = build_mission({"f": [("VAL-run", {"run": rewrite})]})
    run, feature = _judge(mission)
    assert run.status == RunStatus.FAILED, run.verdict
    assert feature.stop_reason == ""


def test_a_relative_submodule_url_is_read_against_the_served_url_through_a_mirror_of_its_own(git_repo, tmp_path):
    served = tmp_path / "served"
    lib = _repo(tmp_path / "lib", {"data.txt": "served answer\n"})
    lib_commit = lib.git("rev-parse", "HEAD").strip()
    _gitlink(git_repo, "vendor/lib", "../lib.git", lib_commit)
    commit = git_repo.git("rev-parse", "HEAD").strip()
    served.mkdir()
    for name, repo in (("lib.git", lib), ("super.git", git_repo)):
        repo.git("clone", "-q", "--bare", str(repo.path), str(served / name))
    with GitDaemon(served) as daemon:
        lib_mirror = mirrors.mirror_dir(normalize(daemon.url("lib.git")))
        counts = []
        for _ in range(2):
            with snapshot(daemon.url("super.git"), commit, submodules=True) as root:
                assert (root / "vendor" / "lib" / "data.txt").read_text() == "served answer\n"
            counts.append(mirrors.fetch_count(lib_mirror))
    assert counts[0] >= 1 and counts[1] == counts[0]  # its own mirror; the second snapshot fetched nothing


def test_the_sweep_removes_the_submodule_index_files_a_killed_worker_left():
    root = snapshot_root()
    left = [root / "run-999-0123456789ab.1.idx", root / "run-999-0123456789ab.2.idx.lock"]
    for path in left:
        path.write_bytes(b"DIRC")
    sweep_snapshots(live_labels=set)
    assert not any(path.exists() for path in left)


def test_a_pointer_whose_name_holds_an_invisible_character_is_blocked_not_an_error(build_mission, git_repo):
    name = "assets/mo\u200bdel.bin"
    git_repo.commit({name: POINTER})
    mission = build_mission(
        {"f": [("VAL-run", {"run": 'python -c "raise SystemExit(1)"'}), ("VAL-file", {"file": name, "contains": "x"})]}
    )
    run, feature = _judge(mission)
    assert run.status == RunStatus.BLOCKED, (run.error, run.verdict)
    assert "mo\\u200bdel.bin" in _verdicts(run)["VAL-run"]["message"]
    assert feature.stop_reason == StopReason.LFS_NOT_FETCHED
