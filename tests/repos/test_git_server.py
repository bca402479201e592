"""Validation of missions whose repository is only a URL served by a real `git daemon`
(docs/REPOSITORIES.md): the workers have no path to it, the agent's clone pushes to it.
What a user notices: the verdict, the runs' errors and the block message, and that a
commit is fetched once per worker, never once per run."""

from __future__ import annotations

import pytest

from fusion_site.repos import mirrors
from missions.models import MissionEvent
from validation.models import RunStatus, ValidatorRun
from validation.services import runner
from validation.services.recovery import recover
from validation.services.verdicts.complete import ERROR_LIMIT
from validation.services.verdicts.task import task_outcome_process

from .conftest import complete, feature, fetch_lines, git, loop_state, mirror_of, url_mission, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def runs_of(mission, key: str) -> list[ValidatorRun]:
    return list(ValidatorRun.objects.filter(feature=feature(mission, key)).order_by("id"))


def test_a_mission_known_only_by_its_url_is_judged_from_the_workers_own_mirror(worker, served, alice, settings):
    mission = url_mission(alice, served.url, ("f1", "f2"))
    assert mission.repository == served.url and not mission.source().local
    revision = served.commit({"f1.txt": "done f1\n", "f2.txt": "done f2\n"}, "implement f1 and f2")

    complete(alice, mission, "f1", revision)
    worker.drain()

    assert loop_state(mission, "f1") == "passed"
    [run] = runs_of(mission, "f1")
    assert run.status == RunStatus.PASSED and run.revision == revision
    mirror = mirror_of(mission)
    assert mirror.parent == settings.FUSION_REPO_CACHE and (mirror / "HEAD").is_file()
    assert git("rev-parse", "--is-bare-repository", cwd=mirror) == "true"
    assert fetch_lines(mirror) == ["clone", f"blobs {revision}"]  # the commit, then its files
    assert not list(settings.FUSION_SNAPSHOT_DIR.iterdir())  # the snapshot is gone

    # A second run of the same commit (another feature judged at it) reads the mirror only.
    fetched, connected = mirrors.fetch_count(mirror), served.daemon.connections()
    complete(alice, mission, "f2", revision)
    worker.drain()
    assert loop_state(mission, "f2") == "passed"
    [run2] = runs_of(mission, "f2")
    assert run2.status == RunStatus.PASSED and run2.revision == revision
    assert mirrors.fetch_count(mirror) == fetched
    assert served.daemon.connections() == connected, "the second run of a commit asked the server again"


def test_a_commit_pushed_after_the_mission_started_is_fetched_once_and_judged(worker, served, alice):
    mission = url_mission(alice, served.url, ("f1", "f2"))
    first = served.commit({"f1.txt": "done f1\n"}, "implement f1")
    complete(alice, mission, "f1", first)
    worker.drain()
    assert loop_state(mission, "f1") == "passed"
    mirror = mirror_of(mission)
    before = fetch_lines(mirror)

    later = served.commit({"f2.txt": "done f2\n"}, "implement f2")  # the mirror has never seen it
    complete(alice, mission, "f2", later)
    worker.drain()

    assert loop_state(mission, "f2") == "passed"
    [run] = runs_of(mission, "f2")
    assert run.status == RunStatus.PASSED and run.revision == later
    assert fetch_lines(mirror)[len(before) :] == [f"commit {later}", f"blobs {later}"]  # by id, once


def test_a_force_pushed_branch_pins_its_new_commit_and_the_old_judgement_stands(worker, served, alice):
    mission = url_mission(alice, served.url, ("f1",))
    right = served.commit({"f1.txt": "done f1\n"}, "right")
    first = complete(alice, mission, "f1", "main")  # a branch name: asked of the server (ls-remote)
    assert (first.revision, first.revision_name) == (right, "main")
    worker.drain()
    assert loop_state(mission, "f1") == "passed"
    [judged] = runs_of(mission, "f1")
    verdict = judged.verdict

    # History rewritten: main now names a wrong implementation, and `right` is on no branch.
    served.clone.git("reset", "-q", "--hard", "HEAD~1")
    wrong = served.commit({"f1.txt": "not yet f1\n"}, "rewritten", push=False)
    served.push(force=True)
    assert git("ls-remote", served.url, "refs/heads/main").split()[0] == wrong

    second = complete(alice, mission, "f1", "main")
    assert (second.revision, second.revision_name) == (wrong, "main")
    worker.drain()

    old, new = runs_of(mission, "f1")
    assert (new.revision, new.status) == (wrong, RunStatus.FAILED)
    assert loop_state(mission, "f1") == "implementing"  # its fix was created
    assert (old.pk, old.revision, old.status, old.verdict) == (judged.pk, right, RunStatus.PASSED, verdict)
    first.refresh_from_db()
    assert first.revision == right


def test_a_commit_never_pushed_blocks_the_feature_naming_it_then_recovery_judges_it(worker, served, alice):
    mission = url_mission(alice, served.url, ("f1",))
    mirrors.ensure_mirror(mission.source())  # the worker has seen the repository before
    commit = served.commit({"f1.txt": "done f1\n"}, "implement f1", push=False)
    complete(alice, mission, "f1", commit)  # a full id is taken as it is: no network call
    worker.drain()

    f1 = feature(mission, "f1")
    assert f1.loop_state == "blocked" and f1.stop_reason == "workspace_unavailable"
    assert commit in f1.stop_detail and served.url in f1.stop_detail
    runs = runs_of(mission, "f1")
    assert [r.status for r in runs] == [RunStatus.ERROR] * ERROR_LIMIT  # retried, then blocked
    assert [r.validator_attempt for r in runs] == list(range(1, ERROR_LIMIT + 1))
    for run in runs:
        assert run.error.startswith("workspace_unavailable: ")
        assert commit in run.error and served.url in run.error

    served.push()
    report = recover()
    assert report["source_available"] == [f1.pk]
    worker.drain()

    assert loop_state(mission, "f1") == "passed"
    last = runs_of(mission, "f1")[-1]
    assert (last.status, last.revision, last.trigger) == (RunStatus.PASSED, commit, "recovery")
    moves = [
        (e.payload["from"], e.payload["loop_state"], e.payload["cause"])
        for e in MissionEvent.objects.filter(mission=mission, type="feature:updated").order_by("seq")
    ]
    assert ("blocked", "validating", "source_available") in moves
    assert recover()["source_available"] == []  # judged once


def stop_server_at_first_fetch(monkeypatch, served) -> list[str]:
    """The server goes away just before the run's first fetch (what the run meets)."""
    real, seen = mirrors.remote_git, []

    def remote(source, args, **kwargs):
        if args[0] == "fetch" and not seen:
            served.daemon.stop()
        seen.append(args[0])
        return real(source, args, **kwargs)

    monkeypatch.setattr(mirrors, "remote_git", remote)
    return seen


def test_a_server_gone_before_the_runs_fetch_is_retried_and_judged_once_back(worker, served, alice, monkeypatch):
    mission = url_mission(alice, served.url, ("f1",))
    mirrors.ensure_mirror(mission.source())
    commit = served.commit({"f1.txt": "done f1\n"}, "implement f1")
    stop_server_at_first_fetch(monkeypatch, served)
    # The server is back before the retry is queued (the error's own transaction sends it).
    real_error, errors = runner.run_error, []

    def run_error(**kwargs):
        errors.append(kwargs)
        if served.daemon.proc is None:
            served.daemon.start()
        return real_error(**kwargs)

    monkeypatch.setattr(runner, "run_error", run_error)
    complete(alice, mission, "f1", commit)
    worker.drain()

    assert loop_state(mission, "f1") == "passed"
    failed, passed = runs_of(mission, "f1")
    assert failed.status == RunStatus.ERROR and failed.error.startswith("workspace_unavailable: ")
    assert "unreachable" in failed.error and served.url in failed.error and commit in failed.error
    assert (passed.status, passed.revision, passed.validator_attempt) == (RunStatus.PASSED, commit, 2)
    assert [e["retry"] for e in errors] == [True]


def test_a_server_away_for_every_attempt_blocks_and_the_sweep_judges_once_it_is_back(worker, served, alice):
    mission = url_mission(alice, served.url, ("f1",))
    mirrors.ensure_mirror(mission.source())
    commit = served.commit({"f1.txt": "done f1\n"}, "implement f1")
    served.daemon.stop()
    complete(alice, mission, "f1", commit)
    worker.drain()

    f1 = feature(mission, "f1")
    assert f1.loop_state == "blocked" and f1.stop_reason == "workspace_unavailable"
    assert served.url in f1.stop_detail and "unreachable" in f1.stop_detail
    assert [r.status for r in runs_of(mission, "f1")] == [RunStatus.ERROR] * ERROR_LIMIT
    assert recover()["source_available"] == []  # still away: skipped, nothing changes
    assert loop_state(mission, "f1") == "blocked"

    served.daemon.start()
    assert recover()["source_available"] == [f1.pk]
    worker.drain()
    assert loop_state(mission, "f1") == "passed"
    assert runs_of(mission, "f1")[-1].status == RunStatus.PASSED


def test_runs_driven_by_hand_meet_the_server_going_and_coming_back(idle_broker, served, alice, monkeypatch):
    """The same, one step at a time (no worker): each attempt is a run of its own."""
    mission = url_mission(alice, served.url, ("f1",))
    mirrors.ensure_mirror(mission.source())
    commit = served.commit({"f1.txt": "done f1\n"}, "implement f1")
    task = complete(alice, mission, "f1", commit)
    task_outcome_process(task_id=task.pk)
    [first] = runs_of(mission, "f1")
    stop_server_at_first_fetch(monkeypatch, served)

    assert runner.execute_run(first.pk) == RunStatus.ERROR
    _, retry = runs_of(mission, "f1")
    assert retry.status == RunStatus.RUNNING and loop_state(mission, "f1") == "validating"
    assert runner.execute_run(retry.pk) == RunStatus.ERROR  # still away: a third run waits

    served.daemon.start()
    third = wait_for(lambda: [r for r in runs_of(mission, "f1") if r.status == RunStatus.RUNNING], message="a retry")
    assert runner.execute_run(third[0].pk) == RunStatus.PASSED
    assert loop_state(mission, "f1") == "passed"
    assert [r.status for r in runs_of(mission, "f1")] == [RunStatus.ERROR, RunStatus.ERROR, RunStatus.PASSED]


def test_an_annotated_tag_is_pinned_to_its_commit_not_to_the_tag_object(worker, served, alice):
    mission = url_mission(alice, served.url, ("f1",))
    commit = served.commit({"f1.txt": "done f1\n"}, "implement f1")
    served.clone.git("tag", "-a", "v1.0", "-m", "release 1.0")
    served.push("refs/tags/v1.0")
    tag_object = git("ls-remote", served.url, "refs/tags/v1.0").split()[0]
    assert tag_object != commit

    task = complete(alice, mission, "f1", "v1.0")
    assert (task.revision, task.revision_name) == (commit, "v1.0")
    worker.drain()
    assert loop_state(mission, "f1") == "passed"
    assert [(r.status, r.revision) for r in runs_of(mission, "f1")] == [(RunStatus.PASSED, commit)]
