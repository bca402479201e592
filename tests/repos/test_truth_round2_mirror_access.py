"""Mirrors are not shared across credentials (docs/REPOSITORIES.md, "The mirror cache").

Two missions read the same URL, served by a git server that wants a token
(tests/repos/httpgit.py; tests/repos/test_credentials.py says why it speaks plain HTTP).
One mission has the token; the other has none. What the first one fetched must never be
judged for the second without the server being asked with the second's own access. And
a commit a worker's mirror already holds is confirmed with the mission's access once per
worker process: a token revoked since then reads nothing.
"""

from __future__ import annotations

import pytest

from fusion_site.repos import mirror_guard, mirrors
from missions.models import Mission
from validation.models import RunStatus, ValidatorRun
from validation.services.verdicts.complete import ERROR_LIMIT

from .conftest import complete, feature, fetch_lines, loop_state, url_mission
from .test_credentials import VAR, http_git, push, source_for, token  # noqa: F401 — fixtures

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_worker():
    mirror_guard.forget()  # this test's worker knows nothing from an earlier test
    yield
    mirror_guard.forget()


@pytest.fixture
def over_http(http_git, token, monkeypatch):
    """The server, every mission's source over it, and the token in the workers' variable."""
    monkeypatch.setattr(Mission, "source", lambda self: source_for(http_git, self.credentials_env))
    monkeypatch.setenv(VAR, token)
    return http_git


def statuses(mission: Mission, key: str) -> list[str]:
    return list(
        ValidatorRun.objects.filter(feature=feature(mission, key)).order_by("id").values_list("status", flat=True)
    )


def test_a_mission_without_the_token_cannot_judge_a_commit_another_mission_fetched_with_it(
    worker, over_http, git_repo, alice
):
    private = push(git_repo, {"f1.txt": "done f1\n"})
    with_token = url_mission(alice, over_http.url("shop.git"), ("f1",), key="holder", credentials_env=VAR)
    complete(alice, with_token, "f1", private)
    worker.drain()
    assert loop_state(with_token, "f1") == "passed"
    refused_before = over_http.refused

    without = url_mission(alice, over_http.url("shop.git"), ("f1",), key="reader")
    complete(alice, without, "f1", private)  # a full id: taken as it is, judged by the worker
    worker.drain()

    f1 = feature(without, "f1")
    assert f1.loop_state == "blocked" and f1.stop_reason == "workspace_unavailable"
    assert private in f1.stop_detail and "unreachable" in f1.stop_detail
    assert statuses(without, "f1") == [RunStatus.ERROR] * ERROR_LIMIT
    assert over_http.refused > refused_before  # the server was asked, and said no
    assert mirrors.mirror_dir(without.source()) != mirrors.mirror_dir(with_token.source())


def test_a_commit_the_mirror_holds_is_confirmed_with_the_missions_access_once_per_worker(
    worker, over_http, git_repo, alice, token, monkeypatch
):
    revision = push(git_repo, {f"f{i}.txt": f"done f{i}\n" for i in range(1, 5)})
    mission = url_mission(alice, over_http.url("shop.git"), ("f1", "f2", "f3", "f4"), credentials_env=VAR)
    complete(alice, mission, "f1", revision)
    worker.drain()
    assert loop_state(mission, "f1") == "passed"
    mirror = mirrors.mirror_dir(mission.source())
    assert fetch_lines(mirror) == ["clone", f"blobs {revision}"]  # cloned here: nothing to confirm

    mirror_guard.forget()  # a new worker process, the same cache on disk
    complete(alice, mission, "f2", revision)
    worker.drain()
    assert loop_state(mission, "f2") == "passed"
    assert fetch_lines(mirror)[2:] == [f"verify {revision}"]  # asked once ...
    complete(alice, mission, "f3", revision)  # ... and not again by this process
    worker.drain()
    assert loop_state(mission, "f3") == "passed" and fetch_lines(mirror)[3:] == []

    mirror_guard.forget()  # another restart, and the token was revoked meanwhile
    monkeypatch.setenv(VAR, "revoked-" + token)
    complete(alice, mission, "f4", revision)
    worker.drain()

    f4 = feature(mission, "f4")
    assert f4.loop_state == "blocked" and f4.stop_reason == "workspace_unavailable"
    assert revision in f4.stop_detail and "with its access" in f4.stop_detail
    assert statuses(mission, "f4") == [RunStatus.ERROR] * ERROR_LIMIT


def test_the_probe_for_servers_without_negotiation_reads_one_commit_with_the_sources_access(
    over_http, git_repo, token, monkeypatch
):
    revision = push(git_repo, {"f1.txt": "done f1\n"})
    source = source_for(over_http)
    mirror_guard._probe(source, revision, timeout=60)  # no exception: the server has it
    with pytest.raises(mirrors.SourceUnavailable, match="with its access"):
        mirror_guard._probe(source, "0" * 40, timeout=60)
    monkeypatch.setenv(VAR, "revoked-" + token)
    with pytest.raises(mirrors.SourceUnavailable, match=revision):
        mirror_guard._probe(source, revision, timeout=60)
