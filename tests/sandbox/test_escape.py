"""Code under judgment cannot leave its sandbox (docs/TRUTH.md, "What the host can and
cannot prove about code that runs inside a check's process"; fusion_site/base/sandbox.py).

The implementation's module, imported by the mission's protected tests, tries each escape
of `attempts.py` (one feature per case, all judged by one real worker in one mission over
one real repository). For each: the attempt fails, the verdict is the one the honest checks
give (a wrong implementation whose escape would have turned its failure into a pass still
fails), nothing outside the check's copy changed, and the service keeps serving. The limits
are small, set here; the checks that reach them fail, naming the limit."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from fusion_site.base import mirrors, sandbox
from fusion_site.base.snapshots import snapshot, snapshot_root
from missions.models import Mission, MissionEvent, MissionFeature
from tests.sandbox import attempts
from tests.support.workers import wait_until
from validation.models import JournalEntry, RunStatus, ValidatorRun
from validation.services.admission import feature_admit

pytestmark = pytest.mark.django_db(transaction=True)

STUB = "def add(a, b):\n    raise NotImplementedError\n"
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
LIMITS = {"processes": 32, "memory_mb": 256, "disk_mb": 32, "file_mb": 8}


@dataclass(frozen=True)
class Case:
    name: str
    honest: bool  # the implementation is right: its protected test passes
    limit: str = ""  # the sandbox limit the check reaches, named in its evidence

    @property
    def verdict(self) -> str:
        return "pass" if self.honest and not self.limit else "fail"


CASES = [
    Case("read_service", honest=True),
    # A wrong implementation: had the escape worked, its failure could have become a pass.
    Case("write_db", honest=False),
    Case("write_data", honest=False),
    Case("write_mirror", honest=False),
    Case("write_snapshot", honest=False),
    Case("write_repo", honest=False),
    Case("network", honest=False),
    Case("daemon", honest=True),
    Case("fork_bomb", honest=True, limit="processes"),
    Case("memory_hog", honest=True, limit="memory"),
    Case("disk_filler", honest=True, limit="disk"),
    Case("disk_filler_tmp", honest=True, limit="disk"),
    Case("file_size", honest=True, limit="file size"),
]


def check_of(case: str) -> dict:
    return {"run": f"python -m pytest -q -s --tb=line -p no:cacheprovider tests/test_{case}.py"}


def test_file(case: str) -> str:
    return f"from calc_{case} import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"


test_file.__test__ = False  # a helper, not a test


def implementation(case: Case) -> str:
    return f'import attempts\n\nattempts.attempt("{case.name}")\n\n\n' + (RIGHT if case.honest else WRONG)


# ------------------------------------------------------------------ what the host holds


def digest(root: Path, *, skip=lambda path: False) -> dict[str, str]:
    """Each file under `root` (symlinks as their target's name): its checksum."""
    found = {}
    for path in sorted(root.rglob("*")):
        if skip(path) or path.is_dir() and not path.is_symlink():
            continue
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        found[str(path.relative_to(root))] = hashlib.sha256(data).hexdigest()
    return found


def is_database(path: Path) -> bool:
    return ".sqlite3" in path.name  # the test database and its journal files change with every run


def with_marker(marker: str) -> list[str]:
    """The host's processes whose command line holds `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError:
        return False


def run_texts(run: ValidatorRun) -> str:
    """Everything the service keeps of a run: its verdict, error, journal and events."""
    journal = JournalEntry.objects.filter(run=run).values_list("payload", flat=True)
    events = MissionEvent.objects.filter(mission_id=run.feature.mission_id).values_list("payload", flat=True)
    return json.dumps([run.verdict, run.error, run.blocked_reason, list(journal), list(events)], default=str)


def escape_lines(text: str, case: str) -> list[str]:
    return re.findall(rf"^ESCAPE {case}: (.*)$", text, re.M)


def api_answers(live_server, user, feature: MissionFeature) -> int:
    request = urllib.request.Request(
        f"{live_server.url}/api/features/{feature.pk}/", headers={"Authorization": f"Token {user.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


# ------------------------------------------------------------------ one mission, every case


@pytest.fixture
def token_user(django_user_model):
    from rest_framework.authtoken.models import Token

    user = django_user_model.objects.get(username="alice")
    user.token = Token.objects.create(user=user).key
    return user


@pytest.fixture
def small_limits(settings):
    settings.FUSION_CHECK_PROCESSES = LIMITS["processes"]
    settings.FUSION_CHECK_MEMORY_MB = LIMITS["memory_mb"]
    settings.FUSION_CHECK_DISK_MB = LIMITS["disk_mb"]
    settings.FUSION_CHECK_FILE_MB = LIMITS["file_mb"]


@pytest.fixture
def service_process(tmp_path):
    """A stand-in for another process of the service, started with a secret in its
    environment (what `/proc/<pid>/environ` shows is what a process was started with)."""
    canary = f"escape-canary-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env={**os.environ, "SECRET_KEY": canary}
    )
    try:
        yield proc.pid, canary
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def bubblewrap():
    if not sandbox.layers_work():
        pytest.fail(f"this suite needs bubblewrap with its overlay layer here: {sandbox.status().record}")


def test_no_escape_succeeds_and_the_verdicts_are_the_honest_ones(
    bubblewrap, small_limits, worker, build_mission, git_repo, live_server, token_user, service_process, subtests
):
    secret = Path(settings.DATA_DIR, "secret_key").read_bytes().strip()
    marker = f"escape-marker-{uuid.uuid4().hex}"
    initial = git_repo.git("rev-parse", "HEAD").strip()
    base = git_repo.commit(
        {"tests/__init__.py": "", **{f"tests/test_{c.name}.py": test_file(c.name) for c in CASES}}
        | {f"calc_{c.name}.py": STUB for c in CASES},
        "the protected tests first",
    )
    sentinel_pid, canary = service_process
    with snapshot(str(git_repo.path), base, label="other") as other:  # another run's snapshot, held
        targets = {
            "service_pids": [os.getpid(), sentinel_pid],  # this process is the server and the worker
            "environ_names": ["SECRET_KEY=", "FUSION_DATA_DIR=", "DATABASE_URL="],
            "secret_key_file": str(Path(settings.DATA_DIR, "secret_key")),
            "data_dir": str(settings.DATA_DIR),
            "sqlite_file": connection.settings_dict["NAME"] if settings.IS_SQLITE else "",
            "feature_table": MissionFeature._meta.db_table,
            "repo_cache": str(mirrors.cache_root()),
            "snapshot_root": str(snapshot_root()),
            "other_snapshot": str(other),
            "repository": str(git_repo.path),
            "base_commit": base,
            "initial_commit": initial,
            "ports": {"server": int(live_server.url.rsplit(":", 1)[1]), "postgresql": 5432, "redis": 6379},
            "marker": marker,
            "limits": LIMITS,
        }
        # The attacks are real: unconfined, the same code reads what the sandbox hides.
        control = _unconfined(attempts.read_service, targets)
        assert f"ESCAPED environ of {sentinel_pid}" in control and "ESCAPED secret key" in control
        assert accepts(targets["ports"]["server"])

        revision = git_repo.commit(
            {"attempts.py": Path(attempts.__file__).read_text(), "targets.json": json.dumps(targets)}
            | {f"calc_{c.name}.py": implementation(c) for c in CASES},
            "an implementation that tries to escape",
        )
        features = {c.name: [(f"VAL-{c.name}", check_of(c.name))] for c in CASES} | {"victim": []}
        mission = build_mission(features, validator="checks", auto_fix=False)
        Mission.objects.filter(pk=mission.pk).update(protected_paths=["tests/**"], base_revision=base)
        victim = MissionFeature.objects.get(key="victim")
        # Fetched now: the runs then have nothing to fetch, and nothing changes the mirror but an escape.
        mirror = mirrors.ensure_commit(mirrors.source_of(str(git_repo.path)), revision)
        before = {
            "repository": digest(git_repo.path),
            "data": digest(settings.DATA_DIR, skip=is_database),
            "mirror": digest(mirror, skip=lambda p: "objects" in p.parts or p.name.startswith("fusion-")),
            "other snapshot": digest(other),
        }

        for case in CASES:
            feature_admit(feature_id=MissionFeature.objects.get(key=case.name).pk, trigger="manual", cause="validate")
        worker.drain(timeout=240)

        after = {
            "repository": digest(git_repo.path),
            "data": digest(settings.DATA_DIR, skip=is_database),
            "mirror": digest(mirror, skip=lambda p: "objects" in p.parts or p.name.startswith("fusion-")),
            "other snapshot": digest(other),
        }
    for name in before:
        with subtests.test(msg=f"{name} unchanged"):
            assert after[name] == before[name]
    with subtests.test(msg="mirror answers only its own history"):
        assert mirrors.mirror_git(mirror, "for-each-ref", "refs/replace").strip() == ""
        assert marker not in mirrors.mirror_git(mirror, "config", "--list")

    for case in CASES:
        with subtests.test(msg=case.name):
            feature = MissionFeature.objects.get(key=case.name)
            run = ValidatorRun.objects.get(feature=feature)
            assert run.sandbox == sandbox.status().record and run.sandbox.startswith("bubblewrap")
            assert run.verdict is not None, run.error
            judged = run.verdict["assertions"][0]
            evidence = judged["evidence"][0]["text"]
            lines = escape_lines(evidence, case.name)
            assert lines and lines[0] == "start", f"the attempt did not run:\n{evidence}"
            assert not [line for line in lines if line.startswith("ESCAPED")], evidence
            assert judged["verdict"] == case.verdict, evidence
            assert run.status == (RunStatus.PASSED if case.verdict == "pass" else RunStatus.FAILED), evidence
            if case.limit:
                hint = next(line for line in evidence.splitlines() if line.startswith("sandbox limit reached ("))
                assert case.limit in hint.split(";")[0], evidence
            texts = run_texts(run)
            for leaked in (secret, canary.encode()):
                assert leaked.decode() not in texts and leaked.hex() not in texts
            _case_specifics(case.name, lines, targets, sentinel_pid)

    with subtests.test(msg="nothing left behind, the database untouched, the service serving"):
        assert with_marker(marker) == []
        victim.refresh_from_db()
        assert victim.loop_state == "idle" and victim.status != "done"
        assert not ValidatorRun.objects.filter(feature=victim).exists()
        assert api_answers(live_server, token_user, victim) == 200


def _unconfined(attempt, targets: dict) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        attempt("control", targets)
    return out.getvalue()


def _case_specifics(case: str, lines: list[str], targets: dict, sentinel_pid: int) -> None:
    """What each attempt says it tried, so a blocked attempt is one that really ran."""
    said = "\n".join(lines)
    if case == "read_service":
        assert f"blocked environ of {sentinel_pid}" in said and "blocked secret key" in said
    elif case == "write_db" and targets["sqlite_file"]:
        assert f"blocked write {targets['sqlite_file']}" in said
    elif case == "write_data":
        assert f"blocked write {targets['secret_key_file']}" in said
    elif case == "write_mirror":
        assert f"blocked mirror cache {targets['repo_cache']}" in said
    elif case == "write_snapshot":
        assert f"blocked write {targets['other_snapshot']}/calc_write_snapshot.py" in said
    elif case == "write_repo":
        assert f"blocked write {targets['repository']}/.git/hooks/post-commit" in said
    elif case == "network":
        for name, port in targets["ports"].items():
            assert f"blocked {name} 127.0.0.1:{port}: ConnectionRefusedError" in said
    elif case == "daemon":
        assert "started 2 processes to leave behind" in said
    elif case in ("fork_bomb", "memory_hog"):
        assert any(line.startswith("blocked after") for line in lines), said
    elif case == "disk_filler_tmp":
        for folder in ("/tmp", "/home/check", "/dev/shm"):
            assert f"blocked {folder} after " in said and "No space left on device" in said
        for folder in ("/dev", "/", "/etc/ssh"):
            assert f"blocked {folder} after 0 MB: Read-only file system" in said


# ------------------------------------------------------------------ a limit the sandbox does not hold yet


@pytest.mark.xfail(
    strict=True,
    reason="FUSION_CHECK_MEMORY_MB bounds the data segment (RLIMIT_DATA), which shared memory "
    "(mmap MAP_SHARED, memfd, SysV shm) is not part of; only a memory cgroup would bound it",
)
def test_a_memory_hog_in_shared_memory_is_stopped(bubblewrap, small_limits, tmp_path):
    from fusion_site.base.proc import run_command, scrubbed_env
    from fusion_site.base.sandbox import Confinement

    size = 4 * LIMITS["memory_mb"] * attempts.MB
    hog = (
        f"import mmap\nm = mmap.mmap(-1, {size})\nfor i in range(0, {size}, 4096):\n    m[i] = 1\n"
        "print('ESCAPED held', len(m) // 1048576, 'MB')\n"
    )
    result = run_command(
        ["python", "-c", hog],
        cwd=tmp_path,
        timeout=120,
        max_output=4096,
        env=scrubbed_env(),
        confine=Confinement(tree=tmp_path, layered=True),
    )
    assert "ESCAPED" not in result.output and not result.ok


# ------------------------------------------------------------------ the modes


def one_feature(build_mission, git_repo) -> MissionFeature:
    base = git_repo.commit({"tests/__init__.py": "", "tests/test_calc.py": test_file("calc")} | {"calc_calc.py": STUB})
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
