"""Hostile repositories and revisions are refused before git runs (docs/REPOSITORIES.md):
remote helpers that run commands, options smuggled in as a URL or a revision, ssh
options in a host name, control characters. Each one would create a file if git (or ssh)
ever ran it; the file never exists, and no git process ever sees the text."""

from __future__ import annotations

import subprocess

import pytest

from fusion_site.repos import mirrors, refs, sources
from fusion_site.repos.snapshots import pin_revision, snapshot
from fusion_site.repos.sources import SourceRefused, normalize
from missions.errors import Invalid
from missions.models import Mission
from missions.services.tasks import task_complete, task_create
from validation.models import RunStatus, ValidatorRun
from validation.services.runner import execute_run
from validation.services.verdicts.task import task_outcome_process

from .conftest import complete, feature, loop_state, url_mission

pytestmark = pytest.mark.django_db(transaction=True)


def hostile_urls(marker) -> list[str]:
    return [
        f"ext::sh -c touch% {marker}",
        f"ext::sh -c 'touch {marker}'",
        f"ext::touch%{marker}",
        "fd::0",
        "fd::3,4",
        f"--upload-pack=touch {marker}",
        f"--upload-pack=touch${{IFS}}{marker}",
        f"-u touch {marker}",
        f"-oProxyCommand=touch${{IFS}}{marker}:shop.git",
        f"git@-oProxyCommand=touch${{IFS}}{marker}:shop.git",
        f"ssh://-oProxyCommand=touch${{IFS}}{marker}/shop.git",
        f"ssh://git@-oProxyCommand=touch${{IFS}}{marker}/shop.git",
        f"ssh://git@127.0.0.1/--upload-pack=touch${{IFS}}{marker}",
        f"git://127.0.0.1/x.git\n--upload-pack=touch${{IFS}}{marker}",
        f"file:///tmp/x.git\t--upload-pack=touch${{IFS}}{marker}",
        "http://127.0.0.1/shop.git",  # a token would travel in clear
        "https://user:hunter2@127.0.0.1/shop.git",  # a password in the URL
        "relative/path/to/repo",
    ]


def hostile_revisions(marker) -> list[str]:
    return [
        f"--output={marker}",
        f"--upload-pack=touch${{IFS}}{marker}",
        "-c",
        "HEAD:../x",
        "main:../../etc/passwd",
        "main..other",
        f"main\n--output={marker}",
        "main\rx",
        "main\x00x",
        "main\\x",
        "",
    ]


@pytest.fixture
def gits(monkeypatch) -> list[list[str]]:
    """Every git process started from here on (the argv), while still running it."""
    real, seen = subprocess.Popen.__init__, []

    def init(self, args, *a, **kw):
        argv = [str(x) for x in (args if isinstance(args, (list, tuple)) else [args])]
        if argv and argv[0].endswith("git"):
            seen.append(argv)
        real(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)
    return seen


def mentions(gits: list[list[str]], text: str) -> bool:
    return any(text in arg for argv in gits for arg in argv)


def test_hostile_repositories_are_refused_by_the_parser_before_any_git(tmp_path, gits):
    marker = tmp_path / "pwned"
    for url in hostile_urls(marker):
        with pytest.raises(SourceRefused):
            normalize(url)
        with pytest.raises(SourceRefused):
            sources.check_repository(url, staff=True)
    assert gits == [] and not marker.exists()


def test_hostile_repositories_are_refused_by_the_api_with_the_reason(api_for, alice, staff, tmp_path, gits):
    marker = tmp_path / "pwned"
    for user in (alice, staff):
        for i, url in enumerate(hostile_urls(marker)):
            response = api_for(user).post(
                "/api/missions/", {"key": f"h{user.pk}-{i}", "title": "Hostile", "repository": url}, format="json"
            )
            assert response.status_code == 400, (url, response.status_code, response.content[:300])
            body = response.json()
            assert body["code"] == "repository_refused" and "repository" in body.get("fields", body), body
    assert not Mission.objects.exists()
    assert gits == [] and not marker.exists()


def test_a_hostile_repository_stored_before_the_checks_existed_reaches_no_git(idle_broker, alice, tmp_path, gits):
    marker = tmp_path / "pwned"
    commit = "a" * 40
    for i, url in enumerate(hostile_urls(marker)):
        mission = Mission.objects.create(key=f"old-{i}", title="Old", owner=alice, status="active", repository=url)
        with pytest.raises(SourceRefused):
            mission.source()
        with pytest.raises(SourceRefused):
            pin_revision(url, commit)
        with pytest.raises(SourceRefused), snapshot(url, commit):
            pass
    assert gits == [] and not marker.exists()


def test_a_run_whose_repository_turned_hostile_is_blocked_at_once_without_git(idle_broker, served, alice, gits):
    marker = served.clone.path.parent / "pwned"
    mission = url_mission(alice, served.url, ("f1",))
    task = complete(alice, mission, "f1", served.commit({"f1.txt": "done f1\n"}))
    task_outcome_process(task_id=task.pk)
    [run] = ValidatorRun.objects.filter(mission=mission)
    Mission.objects.filter(pk=mission.pk).update(repository=f"ext::touch%{marker}")  # behind the API's back
    gits.clear()

    assert execute_run(run.pk) == RunStatus.ERROR
    run.refresh_from_db()
    assert run.error.startswith("workspace_refused: ") and "remote helpers" in run.error
    f1 = feature(mission, "f1")
    assert f1.loop_state == "blocked" and f1.stop_reason == "workspace_unavailable"  # refused: never retried
    assert ValidatorRun.objects.filter(mission=mission).count() == 1
    assert not mentions(gits, "ext::") and not marker.exists()


@pytest.mark.parametrize("where", ["url", "local"])
def test_hostile_revisions_are_refused_at_completion_before_git_sees_them(
    idle_broker, served, alice, git_repo, api_for, where, gits
):
    marker = served.clone.path.parent / "pwned"
    mission = url_mission(alice, served.url if where == "url" else str(git_repo.path), ("f1",))
    task = task_create(user=alice, feature=feature(mission, "f1"))
    for revision in hostile_revisions(marker):
        with pytest.raises(Invalid) as refused:
            task_complete(user=alice, task=task, revision=revision)
        assert refused.value.code in ("unknown_revision", "invalid"), revision
    for revision in hostile_revisions(marker):
        response = api_for(alice).post(f"/api/tasks/{task.pk}/complete/", {"revision": revision}, format="json")
        assert response.status_code == 400, (revision, response.content[:300])
    assert loop_state(mission, "f1") == "implementing"
    assert not ValidatorRun.objects.exists()
    for revision in hostile_revisions(marker):
        if revision:
            assert not mentions(gits, revision), revision
    assert not marker.exists()


def test_the_low_level_functions_refuse_hostile_revisions_too(served, tmp_path, gits):
    marker = tmp_path / "pwned"
    source = normalize(served.url)
    mirror = mirrors.ensure_mirror(source)
    gits.clear()
    for revision in hostile_revisions(marker):
        with pytest.raises(SourceRefused):
            refs.resolve(source, revision)
        with pytest.raises(SourceRefused):
            mirrors.ensure_commit(source, revision)
        with pytest.raises(SourceRefused), snapshot(source, revision):
            pass
    assert gits == [] and not marker.exists()
    assert (mirror / "HEAD").is_file()
