"""Declared environments (docs/ENVIRONMENTS.md), end to end: real git repositories, real
bubblewrap, a real virtualenv installed offline from a wheel the repository carries, a
real `npm ci`; builds counted from the run's journal."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from fusion_site.runtime import envcache, sandbox
from missions.demo.wheel import wheel, wheel_name
from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice
from validation.models import JournalEntry, RunStatus, ValidatorRun
from validation.services import runner
from validation.services.verdicts.admit import feature_admit, rerun

pytestmark = pytest.mark.django_db(transaction=True)

GREET = {"greet.py": "def hello(name):\n    return f'hello {name}'\n"}
TEST_GREET = (
    "import unittest\n\nfrom greet import hello\n\n\nclass T(unittest.TestCase):\n"
    "    def test_hello(self):\n        self.assertEqual(hello('x'), 'hello x')\n"
)
PYTHON_ENV = {
    "preset": "python",
    "setup": ["pip install --no-index --find-links wheels -r requirements.txt"],
    "key_files": ["requirements.txt", "wheels"],
}
UNITTEST = {"run": "python -m unittest -q tests.test_greet", "timeout": 120}


@pytest.fixture(autouse=True)
def _bubblewrap():
    if not sandbox.status().confined:
        pytest.fail(f"these tests need bubblewrap: {sandbox.status().detail}")


def python_project(repo) -> str:
    (repo.path / "wheels").mkdir()
    (repo.path / "wheels" / wheel_name("greet", "1.0")).write_bytes(wheel("greet", "1.0", GREET))
    return repo.commit(
        {"requirements.txt": "greet==1.0\n", "tests/__init__.py": "", "tests/test_greet.py": TEST_GREET},
        "a project needing greet",
    )


def mission_with(repo, base: str, environment: dict, checks: list[dict], **fields) -> MissionFeature:
    mission = Mission.objects.create(
        key="env",
        title="Environment",
        status="active",
        validator="checks",
        repository=str(repo.path),
        base_revision=base,
        base_commit=base,
        environment=environment,
        **fields,
    )
    milestone = Milestone.objects.create(mission=mission, key="m1", title="M1")
    slice_ = Slice(milestone=milestone, key="s1", title="S1")
    slice_.save()
    feature = MissionFeature(slice=slice_, key="f", title="F", description="F.")
    feature.save()
    for i, check in enumerate(checks, 1):
        assertion = ContractAssertion(milestone=milestone, key=f"VAL-{i}", title=f"check {i}", statement="s")
        assertion.check_spec = check
        assertion.save()
        feature.assertions.add(assertion)
    return feature


def judge(feature: MissionFeature, revision: str) -> ValidatorRun:
    run = rerun(feature_id=feature.pk, trigger="manual", cause="validate", revision=revision).run
    assert run is not None
    runner.execute_run(run.pk)
    run.refresh_from_db()
    return run


def environment_note(run: ValidatorRun) -> dict:
    return JournalEntry.objects.get(run=run, kind="note", key="environment").payload


def evidence_texts(run: ValidatorRun) -> list[str]:
    return [e["text"] for a in run.verdict["assertions"] for e in a["evidence"]]


# ---------------------------------------------------------------- python


@pytest.mark.usefixtures("idle_broker")
def test_a_python_environment_is_built_once_per_key_and_mounted_into_every_check(git_repo, settings):
    base = python_project(git_repo)
    feature = mission_with(
        git_repo, base, PYTHON_ENV, [UNITTEST, {"run": "python -c 'import greet, sys; print(sys.prefix)'"}]
    )

    first, second = judge(feature, base), judge(feature, base)
    assert first.status == second.status == RunStatus.PASSED, first.summary
    built, reused = environment_note(first), environment_note(second)
    assert built["ok"] and not built["reused"] and reused["reused"] and built["key"] == reused["key"]
    folder = Path(settings.FUSION_ENV_CACHE) / built["key"]
    # The check's python is the environment's (its prefix printed), at the cache's own path.
    assert str(folder / "venv") in "\n".join(evidence_texts(first))
    assert f"environment {built['key'][:12]}: built in " in "\n".join(evidence_texts(first))
    assert f"environment {built['key'][:12]}: reused" in evidence_texts(second)
    # A key file changed: another key, built once.
    changed = git_repo.commit({"requirements.txt": "# pinned\ngreet==1.0\n"}, "requirements reworded")
    third = judge(feature, changed)
    assert third.status == RunStatus.PASSED
    assert not environment_note(third)["reused"] and environment_note(third)["key"] != built["key"]


@pytest.mark.usefixtures("idle_broker")
def test_without_an_environment_checks_get_the_base_interpreter(git_repo):
    base = python_project(git_repo)
    feature = mission_with(git_repo, base, {}, [UNITTEST])
    run = judge(feature, base)
    assert run.status == RunStatus.FAILED  # greet is installed nowhere
    assert not JournalEntry.objects.filter(run=run, key="environment").exists()
    assert "No module named 'greet'" in "\n".join(evidence_texts(run))


@pytest.mark.usefixtures("idle_broker")
def test_a_revision_that_breaks_its_requirements_fails_every_run_check_with_the_build_log(git_repo):
    base = python_project(git_repo)
    feature = mission_with(git_repo, base, PYTHON_ENV, [UNITTEST, {"file": "requirements.txt", "exists": True}])
    broken = git_repo.commit({"requirements.txt": "greet==1.0\nnot-a-package-anywhere==9.9\n"}, "a new dependency")

    run = judge(feature, broken)
    assert run.status == RunStatus.FAILED
    note = environment_note(run)
    assert not note["ok"] and note["broken_by"] == ["requirements.txt"]
    verdicts = {a["key"]: a for a in run.verdict["assertions"]}
    assert verdicts["VAL-1"]["verdict"] == "fail" and verdicts["VAL-2"]["verdict"] == "pass"
    assert "requirements.txt" in verdicts["VAL-1"]["actual"]
    log = verdicts["VAL-1"]["evidence"][0]["text"]
    assert "build failed" in log and "not-a-package-anywhere" in log


def test_a_setup_that_fails_at_the_base_is_an_error_then_blocks_the_feature(git_repo, worker):
    base = python_project(git_repo)
    feature = mission_with(git_repo, base, {"setup": ["echo the registry is down; exit 3"]}, [UNITTEST])
    feature_admit(feature_id=feature.pk, trigger="manual", cause="validate", revision=base)
    worker.drain(timeout=240)

    runs = list(ValidatorRun.objects.filter(feature=feature).order_by("id"))
    assert len(runs) == 3 and all(r.status == RunStatus.ERROR for r in runs)
    assert all(r.error.startswith("environment_failed: ") and "the registry is down" in r.error for r in runs)
    feature.refresh_from_db()
    assert feature.loop_state == "blocked" and feature.stop_reason == "environment_failed"


@pytest.mark.usefixtures("idle_broker")
def test_the_default_install_uses_the_package_index_the_deployment_names(git_repo, tmp_path, monkeypatch):
    """No `setup`: the preset installs requirements.txt, from the index `PIP_INDEX_URL`
    names (a private mirror: here a server on this machine), which passes to the build."""
    project = tmp_path / "index" / "simple" / "greet"
    project.mkdir(parents=True)
    (project / wheel_name("greet", "1.0")).write_bytes(wheel("greet", "1.0", GREET))
    (project / "index.html").write_text(f'<a href="{wheel_name("greet", "1.0")}">greet</a>')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "index"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple/")
        base = git_repo.commit({"requirements.txt": "greet==1.0\n"}, "a project needing greet")
        feature = mission_with(git_repo, base, {"preset": "python"}, [{"run": "python -c 'import greet'"}])
        run = judge(feature, base)
    finally:
        server.shutdown()
    assert run.status == RunStatus.PASSED, environment_note(run)["log"]
    assert "greet" in environment_note(run)["log"]


@pytest.mark.usefixtures("idle_broker")
def test_only_the_package_index_settings_reach_a_build_and_its_log_is_redacted(git_repo, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror-user:hunter2hunter2@mirror.example/simple/")
    monkeypatch.setenv("FUSION_TEST_SERVICE_SETTING", "service-only-value")
    base = git_repo.commit({"README.md": "# env\n"}, "nothing to install")
    feature = mission_with(git_repo, base, {"setup": ["env | sort"]}, [{"run": "true"}])
    run = judge(feature, base)
    assert run.status == RunStatus.PASSED
    log = environment_note(run)["log"]
    assert "PIP_INDEX_URL=https://[REDACTED]@mirror.example/simple/" in log and "FUSION_ENV=" in log
    assert "hunter2hunter2" not in log and "service-only-value" not in log


# ---------------------------------------------------------------- node


def _tarball(path: Path, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"package/{rel}")
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, __import__("io").BytesIO(data))


@pytest.mark.usefixtures("idle_broker")
def test_a_node_environment_runs_npm_ci_offline_and_its_modules_reach_the_checks(git_repo, tmp_path):
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.fail("node and npm are needed for the node preset")
    (git_repo.path / "vendor").mkdir()
    package = {"name": "shout", "version": "1.0.0", "main": "index.js", "bin": {"shout": "cli.js"}}
    _tarball(
        git_repo.path / "vendor" / "shout-1.0.0.tgz",
        {
            "package.json": json.dumps(package),
            "index.js": "module.exports = (s) => s.toUpperCase();\n",
            "cli.js": "#!/usr/bin/env node\nconsole.log(require('./index.js')(process.argv[2]));\n",
        },
    )
    git_repo.write(
        "package.json",
        json.dumps({"name": "app", "version": "1.0.0", "dependencies": {"shout": "file:vendor/shout-1.0.0.tgz"}}),
    )
    git_repo.write("app.js", "console.log(require('shout')('from the tree'));\n")
    # The lockfile as npm writes it, with no registry (a packed local dependency).
    env = {**os.environ, "npm_config_cache": str(tmp_path / "npm-cache"), "npm_config_audit": "false"}
    subprocess.run(
        ["npm", "install", "--package-lock-only", "--offline"],
        cwd=git_repo.path,
        check=True,
        env=env,
        capture_output=True,
    )
    base = git_repo.commit(message="a node project")
    checks = [
        {"run": "shout hello", "expect_output": "HELLO"},
        {"run": "node app.js", "expect_output": "FROM THE TREE"},
    ]
    feature = mission_with(git_repo, base, {"preset": "node"}, checks)

    run = judge(feature, base)
    assert run.status == RunStatus.PASSED, evidence_texts(run)
    assert environment_note(run)["ok"] and judge(feature, base).status == RunStatus.PASSED
    assert environment_note(ValidatorRun.objects.order_by("-id").first())["reused"]


# ---------------------------------------------------------------- the cache

WAIT_BOTH = """
import os, sys, time
from pathlib import Path

def wait_for(*paths):
    deadline = time.monotonic() + 120
    while not all(Path(p).exists() for p in paths):
        if time.monotonic() > deadline:
            raise SystemExit("the other never started")
        time.sleep(0.01)
"""

PROCESS = (
    WAIT_BOTH
    + """
import django
from django.conf import settings
settings.configure(FUSION_ENV_CACHE=sys.argv[1], FUSION_ENV_CACHE_MB=1024)
django.setup()
from fusion_site.runtime import envcache
here, other, count = sys.argv[2:5]

def build(folder):
    wait_for(other)  # both asked for the key before either could build it
    with open(count, "a") as fh:
        fh.write("built\\n")
    (folder / "payload").write_text("x")
    return True

Path(here).touch()
with envcache.held("ab" * 16, build) as entry:
    print("reused" if entry.reused else "built", entry.path, entry.ready)
"""
)


def test_two_worker_processes_asking_for_one_key_build_it_once(tmp_path):
    cache, count = tmp_path / "envs", tmp_path / "count"
    argv = [sys.executable, "-c", PROCESS, str(cache)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    a = subprocess.Popen(
        [*argv, str(tmp_path / "a"), str(tmp_path / "b"), str(count)], stdout=subprocess.PIPE, text=True, env=env
    )
    b = subprocess.Popen(
        [*argv, str(tmp_path / "b"), str(tmp_path / "a"), str(count)], stdout=subprocess.PIPE, text=True, env=env
    )
    outputs = sorted(p.communicate(timeout=300)[0].split()[0] for p in (a, b))
    assert a.returncode == b.returncode == 0
    assert outputs == ["built", "reused"] and count.read_text() == "built\n"


def test_two_threads_asking_for_one_key_build_it_once(tmp_path, settings):
    settings.FUSION_ENV_CACHE = tmp_path / "envs"
    started = [threading.Event(), threading.Event()]
    builds, entries = [], []

    def build(folder: Path) -> bool:
        assert all(e.wait(120) for e in started)  # both asked before either built
        builds.append(folder)
        return True

    def ask(i: int) -> None:
        started[i].set()
        with envcache.held("cd" * 16, build) as entry:
            entries.append(entry)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(builds) == 1 and sorted(e.reused for e in entries) == [False, True]
    assert all(e.ready and e.path == builds[0] for e in entries)


def test_the_least_recently_used_environments_go_past_the_byte_bound_never_one_in_use(tmp_path, settings):
    settings.FUSION_ENV_CACHE = tmp_path / "envs"
    settings.FUSION_ENV_CACHE_MB = 1
    half_mb = b"x" * (512 * 1024)

    def build(folder: Path) -> bool:
        (folder / "payload").write_bytes(half_mb)
        return True

    keys = [c * 32 for c in "0123"]
    with envcache.held(keys[0], build):  # in use throughout: never evicted
        for key in keys[1:]:
            with envcache.held(key, build):
                pass
        left = sorted(p.name for p in Path(settings.FUSION_ENV_CACHE).iterdir() if envcache.KEY_NAME.match(p.name))
    # 4 × 0.5 MB over a 1 MB bound: the oldest not in use went, the one in use stayed.
    assert left == [keys[0], keys[3]]


def test_a_failed_build_leaves_nothing_and_the_next_use_builds_again(tmp_path, settings):
    settings.FUSION_ENV_CACHE = tmp_path / "envs"
    with envcache.held("ef" * 16, lambda folder: False) as entry:
        assert not entry.ready and not entry.path.exists()
    with envcache.held("ef" * 16, lambda folder: True) as entry:
        assert entry.ready and not entry.reused and entry.path.is_dir()
