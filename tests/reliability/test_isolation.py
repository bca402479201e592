"""Isolation and redaction.

- Command checks, the `command` validator and the `command` task executor never see the
  server's secrets: with SECRET_KEY-, DATABASE_URL-, *_TOKEN- and plainly named secrets
  in the server's environment, a command that prints its whole environment shows none
  of their names or values (checked on the raw output, before any redaction).
- Paths and symlinks cannot leave a snapshot: file checks, the host's file-evidence
  validator and the agent's read-only tools (read, ls, grep, find).
- Secrets planted in a repository file and in command output are redacted from the
  evidence, the failures, the events (MissionEvent payloads), the fix feature's
  description and the journal's rendered views (API and admin).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from fusion_site.runtime import sandbox
from fusion_site.runtime.proc import run_command
from missions.models import (
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    Slice,
    Task,
)
from validation.models import JournalEntry, ValidatorFailure, ValidatorRun
from validation.services import runner
from validation.services.verdicts.admit import feature_admit

pytestmark = pytest.mark.django_db

SERVER_SECRETS = {
    "SECRET_KEY": "django-insecure-CANARY-secret-key-value-0001",
    "DATABASE_URL": "postgres://fusion:CANARYdbPASS@db.internal:5432/fusion",
    "REDIS_URL": "redis://:CANARYredisPASS@cache.internal:6379/3",
    "MY_SERVICE_TOKEN": "tok-CANARY-service-token-0099",
    "FUSION_PLAIN_CANARY": "plain-canary-value-7777",  # a name with no hint of a secret
}
PRINT_ENV = f'{sys.executable} -c "import os, json; print(json.dumps(dict(os.environ)))"'


@pytest.fixture
def server_secrets(monkeypatch):
    for name, value in SERVER_SECRETS.items():
        monkeypatch.setenv(name, value)
    return SERVER_SECRETS


def assert_no_server_secret(text: str) -> None:
    for name, value in SERVER_SECRETS.items():
        assert name not in text, f"{name} reached the command"
        assert value not in text, f"the value of {name} reached the command"


def _env_of(output: str) -> dict:
    start = output.index("{")
    return json.loads(output[start : output.rindex("}") + 1])


# ======================================================================= environment


def test_a_command_check_does_not_see_the_servers_secrets(server_secrets, tmp_path):
    from django.conf import settings

    result = run_command(PRINT_ENV, cwd=tmp_path, timeout=30, max_output=settings.FUSION_CHECK_OUTPUT_BYTES)
    assert result.ok, result.output
    env = _env_of(result.output)
    assert_no_server_secret(result.output)
    # `python` is the service's base interpreter, never its virtualenv (docs/SANDBOX.md).
    assert Path(env["PATH"].split(os.pathsep)[0]) == sandbox.check_interpreter().parent != Path(sys.executable).parent
    # GIT_CEILING_DIRECTORIES: git in a check finds no repository above the snapshots (docs/TRUTH.md).
    allowed = {"PATH", "HOME", "PYTHONDONTWRITEBYTECODE", "LANG", "LC_ALL", "TZ", "TERM", "PWD", "SHLVL", "_"}
    assert set(env) <= allowed | {"GIT_CEILING_DIRECTORIES"}
    assert env["GIT_CEILING_DIRECTORIES"] == str(settings.FUSION_SNAPSHOT_DIR)


def test_a_shell_check_does_not_see_the_servers_secrets(server_secrets, tmp_path):
    from validation.validators.check_kinds import judge_run

    verdict, _expected, _actual, evidence = judge_run(tmp_path, {"run": "env; echo done", "shell": True})
    assert verdict == "pass"
    raw = run_command("env", cwd=tmp_path, timeout=30, max_output=65536, shell=True).output
    assert_no_server_secret(raw)
    assert_no_server_secret(evidence)


def _mission(users, repo, **fields) -> tuple[Mission, MissionFeature]:
    mission = Mission.objects.create(
        key="iso", title="Isolation", owner=users.owner, status="active", repository=str(repo.path), **fields
    )
    milestone = Milestone.objects.create(mission=mission, key="m1", title="M1")
    slice_ = Slice(milestone=milestone, key="s1", title="S1")
    slice_.save()
    feature = MissionFeature(slice=slice_, key="f1", title="Feature one", description="Do it.")
    feature.save()
    return mission, feature


def test_the_command_executor_does_not_see_the_servers_secrets(server_secrets, users, git_repo):
    from missions.services.executor import task_execute
    from missions.services.tasks import task_create

    mission, feature = _mission(users, git_repo, executor="command", executor_command=PRINT_ENV)
    task = task_create(user=users.staff, feature=feature)
    task.refresh_from_db()
    assert task.status == "in_progress"
    assert task_execute(task_id=task.pk) == "done"
    task.refresh_from_db()
    assert task.status == "done" and "PATH" in task.log
    assert_no_server_secret(task.log)
    env = _env_of(task.log)
    assert env["FUSION_TASK_ID"] == str(task.pk)


def test_the_command_validator_does_not_see_the_servers_secrets(server_secrets, users, git_repo, settings, tmp_path):
    """The validator command writes its environment to a file and answers a valid verdict.
    Unsandboxed, so that it can write the test's file: what it is given is the same in the
    sandbox, where it writes nothing of the host's (tests/sandbox/test_modes.py)."""
    settings.FUSION_SANDBOX = "off"
    dump = tmp_path / "validator-env.json"
    script = tmp_path / "validator.py"
    script.write_text(
        "import json, os, sys\n"
        f"open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))\n"
        "print(json.dumps({'status': 'pass', 'summary': 'ok', 'assertions': [{'key': 'VAL-ENV', 'verdict': 'pass',"
        " 'message': 'fine', 'evidence': [{'kind': 'other', 'text': 'looked'}]}]}))\n"
    )
    settings.FUSION_VALIDATORS = {
        "cmd": {"kind": "command", "command": [sys.executable, str(script)], "api_key_env": "MY_SERVICE_TOKEN"}
    }
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"})
    mission, feature = _mission(users, git_repo, validator="cmd")
    assertion = ContractAssertion(milestone=feature.slice.milestone, key="VAL-ENV", title="t", statement="s")
    assertion.save()
    FeatureAssertion.objects.create(feature=feature, assertion=assertion)
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    assert runner.execute_run(run.pk) == "passed", ValidatorRun.objects.get(pk=run.pk).error
    seen = dump.read_text()
    # The one secret a profile names (`api_key_env`) is handed over on purpose; nothing else.
    env = json.loads(seen)
    assert env.get("MY_SERVICE_TOKEN") == SERVER_SECRETS["MY_SERVICE_TOKEN"]
    for name, value in SERVER_SECRETS.items():
        if name != "MY_SERVICE_TOKEN":
            assert name not in seen and value not in seen, name


# ============================================================================= paths


@pytest.fixture
def escaping_repo(git_repo, tmp_path):
    """A repository whose snapshot holds symlinks to a file and a folder outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("OUTSIDE-CANARY-CONTENT\n")
    os.symlink(outside / "secret.txt", git_repo.path / "leak.txt")
    os.symlink(outside, git_repo.path / "leakdir")
    os.symlink("../../../../../../../../etc/passwd", git_repo.path / "passwd")
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n", "inside/ok.txt": "fine\n"}, "symlinks")
    return git_repo


def _checkout(repo):
    from fusion_site.repos.snapshots import snapshot

    return snapshot(str(repo.path), repo.git("rev-parse", "HEAD").strip(), label="iso")


ESCAPES = [
    "../outside/secret.txt",
    "/etc/passwd",
    "leak.txt",
    "leakdir/secret.txt",
    "passwd",
    "inside/../../x",
    "leakdir",
    "./../repo/hello.py",
    "a\x00b",
]


@pytest.mark.parametrize("path", ESCAPES)
def test_file_checks_cannot_leave_the_snapshot(escaping_repo, path):
    from missions.checks_spec import check_spec_problems
    from validation.validators.check_kinds import judge_file

    with _checkout(escaping_repo) as root:
        for spec in (
            {"file": path, "exists": True},
            {"file": path, "contains": "CANARY|root"},
            {"file": path, "not_contains": "CANARY|root"},
        ):
            verdict, expected, actual, evidence = judge_file(root, spec)
            text = " ".join((expected, actual, evidence))
            assert "OUTSIDE-CANARY-CONTENT" not in text and "root:x:" not in text
            if "exists" in spec:
                assert verdict == "fail", (path, verdict, actual)
            elif "not_contains" in spec:
                assert verdict == "fail" or "escapes" not in text  # never a pass by reading outside
            else:
                assert verdict == "fail", (path, verdict, actual)
        if ".." in path or path.startswith("/") or "\x00" in path:
            assert check_spec_problems({"file": path, "exists": True})  # refused at the API already


@pytest.mark.parametrize("path", ESCAPES)
def test_agent_tools_cannot_leave_the_snapshot(escaping_repo, path):
    tools = pytest.importorskip("validation.validators.tools")
    with _checkout(escaping_repo) as root:
        answers = [
            tools.read(root, path),
            tools.ls(root, path),
            tools.grep(root, "CANARY|root:x", path),
            tools.find(root, "*", path),
        ]
        for answer in answers:
            assert "OUTSIDE-CANARY-CONTENT" not in answer and "root:x:" not in answer, (path, answer)
        # the whole tree, from the root: symlinked files outside and symlinked folders are skipped
        for answer in (tools.grep(root, "CANARY|root:x"), tools.find(root, "*secret*"), tools.find(root, "*")):
            assert "OUTSIDE-CANARY" not in answer and "root:x:" not in answer and "secret.txt" not in answer, answer


def test_file_evidence_that_points_outside_the_snapshot_is_rejected(escaping_repo):
    from validation.verdict import FrozenContext, parse_candidate, run_host_validators

    with _checkout(escaping_repo) as root:
        for ref in ("leak.txt:1", "../outside/secret.txt", "/etc/passwd:1", "leakdir/secret.txt", "passwd:1"):
            verdict, _ = parse_candidate(
                {
                    "status": "pass",
                    "assertions": [
                        {"key": "K", "verdict": "pass", "message": "m", "evidence": [{"kind": "file", "text": ref}]}
                    ],
                }
            )
            report = run_host_validators(verdict, FrozenContext(keys=("K",), checkout=root))
            assert "file_evidence_exists" in report.problems, ref
        ok, _ = parse_candidate(
            {
                "status": "pass",
                "assertions": [
                    {
                        "key": "K",
                        "verdict": "pass",
                        "message": "m",
                        "evidence": [{"kind": "file", "text": "hello.py:1"}],
                    }
                ],
            }
        )
        assert run_host_validators(ok, FrozenContext(keys=("K",), checkout=root)).ok


# ========================================================================= redaction

PLANTED = {
    "openai": "sk-CANARYabcdefghijklmnopqrstuvwxyz0123",
    "password": "hunter2-CANARY-pw",
    "token_env": "tok-CANARY-from-env-value-42",
}


@pytest.fixture
def leaky_feature(users, git_repo, monkeypatch):
    """A feature whose check prints a config file full of secrets and then fails, in a
    mission with auto-fix on (so the failure becomes a fix feature)."""
    monkeypatch.setenv("DEPLOY_API_TOKEN", PLANTED["token_env"])
    config = (
        f"OPENAI_KEY={PLANTED['openai']}\n"
        f"db_password={PLANTED['password']}\n"
        f"deploy token value: {PLANTED['token_env']}\n"
    )
    leak = f'echo password={PLANTED["password"]} {PLANTED["openai"]}\necho "$HOME" >&2\nexit 3\n'
    git_repo.commit({"config.env": config, "leak.sh": leak, "hello.py": "def hello():\n    return 'hi'\n"}, "config")
    mission, feature = _mission(users, git_repo, auto_fix=True)
    checks = [
        ("VAL-CAT", {"run": "cat config.env", "expect_output": "never-there"}),  # command output
        ("VAL-GREP", {"file": "config.env", "not_contains": "OPENAI_KEY"}),  # a repository file
        ("VAL-ECHO", {"run": "sh leak.sh"}),  # a program's own output
    ]
    for key, spec in checks:
        a = ContractAssertion(milestone=feature.slice.milestone, key=key, title=key, statement=key, check_spec=spec)
        a.save()
        FeatureAssertion.objects.create(feature=feature, assertion=a)
    return mission, feature


def _leaks(text: str) -> list[str]:
    return [name for name, value in PLANTED.items() if value in text]


@pytest.mark.django_db(transaction=True)  # checks run in threads with their own connections
def test_planted_secrets_are_redacted_everywhere_they_are_shown(leaky_feature, users):
    mission, feature = leaky_feature
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    assert runner.execute_run(run.pk) == "failed", ValidatorRun.objects.get(pk=run.pk).error
    run.refresh_from_db()
    failures = list(ValidatorFailure.objects.filter(run=run))
    assert {f.assertion_key for f in failures} == {"VAL-CAT", "VAL-GREP", "VAL-ECHO"}
    assert any("[REDACTED]" in json.dumps(f.evidence) for f in failures)  # they were there, and were cut

    # evidence, failures and the stored verdict
    for f in failures:
        assert not _leaks(json.dumps([f.message, f.expected, f.actual, f.evidence])), f.assertion_key
    assert not _leaks(json.dumps(run.verdict))
    # the fix feature's description (the validation cause)
    fix = MissionFeature.objects.get(generated_from=feature)
    assert "Validation cause" in fix.description and "[REDACTED]" in fix.description
    assert not _leaks(fix.description)
    # every event of the mission
    for event in MissionEvent.objects.filter(mission=mission):
        assert not _leaks(json.dumps(event.payload)), event.type
    # the journal as stored and as rendered by the API (run, journal) and the admin
    assert JournalEntry.objects.filter(run=run).exists()
    for entry in JournalEntry.objects.filter(run=run):
        assert not _leaks(json.dumps(entry.payload)), entry.seq
    api = APIClient()
    api.force_authenticate(users.owner)
    for url in (
        f"/api/validation-runs/{run.pk}/journal/",
        f"/api/validation-runs/{run.pk}/",
        f"/api/features/{feature.pk}/loop/",
        f"/api/features/{fix.pk}/",
        f"/api/missions/{mission.pk}/events/",
        f"/api/missions/{mission.pk}/export/",
    ):
        response = api.get(url)
        assert response.status_code == 200, url
        assert not _leaks(response.content.decode()), url
    admin = Client()
    admin.force_login(users.staff)
    pages = [
        reverse("admin:validation_validatorrun_change", args=[run.pk]),
        reverse("admin:validation_journalentry_changelist") + f"?run__id__exact={run.pk}",
        reverse("admin:missions_missionfeature_change", args=[fix.pk]),
    ]
    pages += [
        reverse("admin:validation_journalentry_change", args=[e.pk]) for e in JournalEntry.objects.filter(run=run)
    ]
    pages += [reverse("admin:validation_validatorfailure_change", args=[f.pk]) for f in failures]
    for url in pages:
        response = admin.get(url)
        assert response.status_code == 200, url
        assert not _leaks(response.content.decode()), url
    dashboard = Client()
    dashboard.force_login(users.owner)
    for url in (f"/runs/{run.pk}/", f"/features/{fix.pk}/", f"/features/{feature.pk}/", f"/missions/{mission.pk}/"):
        response = dashboard.get(url)
        assert response.status_code == 200, url
        assert not _leaks(response.content.decode()), url


def test_the_redactor_covers_the_planted_shapes(monkeypatch):
    from fusion_site.runtime.redact import redact

    monkeypatch.setenv("DEPLOY_API_TOKEN", PLANTED["token_env"])
    text = (
        f"key {PLANTED['openai']} and password={PLANTED['password']} and PASSWORD: '{PLANTED['password']}' "
        f"and {PLANTED['token_env']} and postgres://u:pw-CANARY@h/db and Authorization: Bearer abcdefghij"
    )
    out = redact(text)
    assert not _leaks(out) and "pw-CANARY" not in out, out
    monkeypatch.setenv("ci_secret", "lower-case-name-CANARY")  # a name is matched whatever its case
    assert "CANARY" not in redact("echo lower-case-name-CANARY")
