"""Credentials (docs/REPOSITORIES.md, "Credentials"): `credentials_env` names a variable on
the workers; its value reaches git only through `GIT_CONFIG_*` variables and is found in
no stored text, log record or worker output — even when the server echoes what it got.

The server is `git http-backend` behind a small HTTP server that wants
`Authorization: Basic base64(x-access-token:<token>)` (tests/repos/httpgit.py). It speaks
plain HTTP: users may only name `https://` (a token never travels in clear), and giving
this test TLS would mean a CA the scrubbed git environment cannot be told about. So the
test builds its `Source` directly (`OverPlainHttp`): `git_env` gives it exactly the https
treatment (the header, the askpass and prompt guards), and `http` joins the protocols git
may use for the length of the test. The mission's `source()` returns that source; every
other step of the loop is the real one.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import secrets
import subprocess
from pathlib import Path

import pytest

from fusion_site.repos import mirrors, sources
from fusion_site.repos.snapshots import snapshot
from fusion_site.repos.sources import Source, SourceUnavailable
from missions.errors import Invalid
from missions.models import Mission
from missions.services.tasks import task_complete
from validation.models import RunStatus, ValidatorRun
from validation.services.verdicts.complete import ERROR_LIMIT

from .conftest import complete, feature, loop_state, stored_text, url_mission
from .httpgit import HttpGit

VAR = "FUSION_TEST_GIT_TOKEN"


@dataclasses.dataclass(frozen=True)
class OverPlainHttp(Source):
    """A source git reads over the plain-HTTP test server with the https credentials path."""

    @property
    def scheme(self) -> str:
        return "https"


def forms(secret: str) -> list[str]:
    """The secret as it could leak: itself, its base64, the whole Basic credential."""
    return [
        secret,
        base64.b64encode(secret.encode()).decode(),
        base64.b64encode(f"x-access-token:{secret}".encode()).decode(),
    ]


def leaks(text: str, *secrets_: str) -> list[str]:
    return [form for secret in secrets_ for form in forms(secret) if form in text]


def files_text(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*") if p.is_file())


@pytest.fixture
def token() -> str:
    return "fmtok-" + secrets.token_hex(16)


@pytest.fixture
def http_git(tmp_path, token, git_repo, monkeypatch, settings):
    monkeypatch.setattr(sources, "URL_SCHEMES", (*sources.URL_SCHEMES, "http"))
    server = HttpGit(tmp_path / "http", user="x-access-token", token=token, echo=True).start()
    settings.FUSION_GIT_CREDENTIALS = {VAR: [server.url("")]}  # the deployment lets VAR go there
    server.bare("shop.git", source=git_repo.path)
    git_repo.git("remote", "add", "origin", str(server.base / "shop.git"))  # the agent pushes to it
    try:
        yield server
    finally:
        server.stop()


def source_for(server: HttpGit, credentials_env: str = VAR) -> OverPlainHttp:
    return OverPlainHttp(url=server.url("shop.git"), local=False, credentials_env=credentials_env)


def push(repo, files: dict[str, str]) -> str:
    revision = repo.commit(files, "work")
    repo.git("push", "-q", "origin", "HEAD:refs/heads/main")
    return revision


def test_the_token_opens_the_repository_and_a_wrong_one_is_refused_unseen(http_git, git_repo, token, monkeypatch):
    source = source_for(http_git)
    revision = push(git_repo, {"f1.txt": "done f1\n"})
    monkeypatch.setenv(VAR, token)
    with snapshot(source, revision) as folder:
        assert (folder / "f1.txt").read_text() == "done f1\n"
    assert http_git.authorized > 0 and http_git.refused == 0

    wrong = "fmtok-" + secrets.token_hex(16)
    monkeypatch.setenv(VAR, wrong)
    later = push(git_repo, {"f2.txt": "done f2\n"})
    with pytest.raises(SourceUnavailable) as refused, snapshot(source, later):
        pass
    message = str(refused.value)
    assert "remote error: refused" in message and later in message and source.display in message
    assert leaks(message, token, wrong) == []
    assert http_git.refused > 0
    assert leaks(files_text(mirrors.cache_root()), token, wrong) == []  # nothing on disk either


def test_a_variable_holding_user_and_password_is_sent_as_they_are(tmp_path, git_repo, monkeypatch, settings):
    monkeypatch.setattr(sources, "URL_SCHEMES", (*sources.URL_SCHEMES, "http"))
    password = secrets.token_hex(12)
    with HttpGit(tmp_path / "http", user="alice", token=password) as server:
        settings.FUSION_GIT_CREDENTIALS = {VAR: [server.url("")]}
        server.bare("shop.git", source=git_repo.path)
        revision = git_repo.git("rev-parse", "HEAD").strip()
        monkeypatch.setenv(VAR, f"alice:{password}")
        with snapshot(source_for(server), revision) as folder:
            assert (folder / "README.md").is_file()
        assert server.authorized > 0 and server.refused == 0


def test_the_workers_own_git_config_never_lends_its_credentials(http_git, git_repo, token, tmp_path, monkeypatch):
    """A worker whose user has a credential helper (a developer's machine, a CI runner)
    must not answer for a mission that set no credentials: that would let any member read
    what the worker's owner may read."""
    marker = tmp_path / "helper-ran"
    home = tmp_path / "home"
    home.mkdir()
    helper = f"!f() {{ touch {marker}; echo username=x-access-token; echo password={token}; }}; f"
    subprocess.run(["git", "config", "--file", str(home / ".gitconfig"), "credential.helper", helper], check=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv(VAR, raising=False)
    revision = push(git_repo, {"f1.txt": "done f1\n"})

    with pytest.raises(SourceUnavailable):
        mirrors.ensure_commit(source_for(http_git, credentials_env=""), revision)
    assert not marker.exists() and http_git.authorized == 0


@pytest.mark.django_db(transaction=True)
def test_no_stored_text_log_or_output_ever_holds_the_token(
    worker, http_git, git_repo, alice, token, monkeypatch, caplog, capfd
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(VAR, token)
    mission = url_mission(alice, http_git.url("shop.git"), ("f1", "f2"), credentials_env=VAR)
    monkeypatch.setattr(Mission, "source", lambda self: source_for(http_git, self.credentials_env))

    right = push(git_repo, {"f1.txt": "done f1\n"})
    task = complete(alice, mission, "f1", "main")  # a branch: ls-remote with the token
    assert task.revision == right
    worker.drain()
    assert loop_state(mission, "f1") == "passed"
    assert ValidatorRun.objects.get(feature=feature(mission, "f1")).status == RunStatus.PASSED

    wrong = "fmtok-" + secrets.token_hex(16)
    monkeypatch.setenv(VAR, wrong)  # the variable now holds a token the server refuses
    with pytest.raises(Invalid) as refused:
        complete(alice, mission, "f2", "main")
    assert "remote error: refused" in str(refused.value) and leaks(str(refused.value), token, wrong) == []
    later = push(git_repo, {"f2.txt": "done f2\n"})
    task = feature(mission, "f2").tasks.get()
    task_complete(user=alice, task=task, revision=later)
    worker.drain()

    f2 = feature(mission, "f2")
    assert f2.loop_state == "blocked" and f2.stop_reason == "workspace_unavailable"
    assert later in f2.stop_detail and "remote error: refused" in f2.stop_detail
    runs = list(ValidatorRun.objects.filter(feature=f2))
    assert [r.status for r in runs] == [RunStatus.ERROR] * ERROR_LIMIT

    assert VAR in stored_text()  # the name is stored, the value never
    assert leaks(stored_text(), token, wrong) == []
    logged = "\n".join(
        [caplog.text] + [r.getMessage() + repr(r.args) + str(r.exc_info) + repr(r.__dict__) for r in caplog.records]
    )
    assert leaks(logged, token, wrong) == []
    out, err = capfd.readouterr()
    assert leaks(out + err, token, wrong) == []
    assert leaks(files_text(mirrors.cache_root()), token, wrong) == []
