"""The `checks` validator against a real git worktree snapshot."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from fusion_site.repos.snapshots import SnapshotError, snapshot
from missions.checks_spec import check_spec_problems
from validation.context import AssertionSpec
from validation.validators.check_kinds import judge_assertion

APP = {
    "app.py": (
        "import sys\n\ndef greet(name):\n    return f'hello {name}'\n\n"
        "print(greet('world'))\nsys.exit(3 if '--fail' in sys.argv else 0)\n"
    ),
    "docs/notes.txt": "first line\nTODO: remove me\nlast line\n",
}


@pytest.fixture
def rev(git_repo) -> str:
    return git_repo.commit(APP, "app")


def judge(git_repo, rev, check: dict, key: str = "VAL-1"):
    with snapshot(str(git_repo.path), rev) as root:
        return judge_assertion(root, AssertionSpec(key=key, title=f"{key} holds", statement=key, check=check))


def evidence_text(verdict) -> str:
    assert len(verdict.evidence) == 1
    return verdict.evidence[0].text


# --- run checks -----------------------------------------------------------------


def test_run_passes_with_expected_exit(git_repo, rev):
    verdict = judge(git_repo, rev, {"run": "python app.py"})
    assert verdict.verdict == "pass", verdict
    assert verdict.evidence[0].kind == "test-output"
    assert "hello world" in evidence_text(verdict) and evidence_text(verdict).startswith("exit 0")


def test_run_fails_on_unexpected_exit_and_honours_expect_exit(git_repo, rev):
    failed = judge(git_repo, rev, {"run": "python app.py --fail"})
    assert failed.verdict == "fail"
    assert (failed.expected, failed.actual) == ("`python app.py --fail` exits 0", "exit 3")
    assert evidence_text(failed).startswith("exit 3")
    expected_three = judge(git_repo, rev, {"run": "python app.py --fail", "expect_exit": 3})
    assert expected_three.verdict == "pass"


def test_expect_output_is_a_regex_matched_anywhere(git_repo, rev):
    assert judge(git_repo, rev, {"run": "python app.py", "expect_output": r"wor.d"}).verdict == "pass"
    assert judge(git_repo, rev, {"run": "python app.py", "expect_output": r"^hello \w+$"}).verdict == "pass"
    missing = judge(git_repo, rev, {"run": "python app.py", "expect_output": r"goodbye"})
    assert missing.verdict == "fail" and "does not match" in missing.actual
    assert missing.expected == "`python app.py` exits 0 and its output matches /goodbye/"


SLOW = 'python -c "import time; time.sleep(30)"'


@pytest.mark.parametrize(
    ("check", "expected", "actual"),
    [
        ({"run": "python app.py --fail", "expect_output": "hello"}, "exits 0 and its output matches /hello/", "exit 3"),
        ({"run": "python app.py", "expect_exit": 3}, "exits 3", "exit 0"),
        (
            {"run": "python app.py", "expect_exit": 3, "expect_output": r"bye\b"},
            "exits 3 and its output matches /bye\\b/",
            "exit 0",
        ),
        (
            {"run": SLOW, "timeout": 1, "expect_output": "woke"},
            "finishes within 1s, exits 0 and its output matches /woke/",
            "timed out after 1s and was killed",
        ),
        (
            {"run": "no-such-program-xyz --version", "expect_output": "1.0"},
            "exits 0 and its output matches /1.0/",
            None,
        ),
    ],
    ids=["exit-failed-output-expected", "exit-code", "exit-code-and-output", "timeout", "cannot-start"],
)
def test_a_failed_run_check_states_its_whole_expectation(git_repo, rev, check, expected, actual):
    verdict = judge(git_repo, rev, check)
    assert verdict.verdict == "fail"
    assert verdict.expected == f"`{check['run']}` {expected}"
    assert actual is None or verdict.actual == actual


def test_a_command_that_cannot_start_fails(git_repo, rev):
    verdict = judge(git_repo, rev, {"run": "no-such-program-xyz --version"})
    assert verdict.verdict == "fail" and "cannot start" in verdict.actual


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed orphan may linger as a zombie until its new parent reaps it: it no longer runs.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _sleepers(marker: str) -> list[int]:
    """Live host processes running `sleep <marker>`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", marker.encode()] and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_hanging_command_times_out_and_its_children_are_killed(git_repo, rev, settings, mode):
    settings.FUSION_SANDBOX = mode  # sandboxed (its pid namespace dies) and not (the process group is killed)
    marker = f"{30 + (time.time_ns() % 10**6) / 10**7:.7f}"  # a `sleep` argument no other process has
    script = f"import subprocess,time; p=subprocess.Popen(['sleep','{marker}']); print('started', flush=True); time.sleep(30)"
    started = time.monotonic()
    verdict = judge(git_repo, rev, {"run": f'python -c "{script}"', "timeout": 1})
    assert time.monotonic() - started < 20
    assert verdict.verdict == "fail"
    assert "timed out" in verdict.actual and "timed out after 1s" in evidence_text(verdict)
    assert "started" in evidence_text(verdict)
    deadline = time.monotonic() + 5
    while _sleepers(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _sleepers(marker), "the child of a timed-out check survived"


def test_flooding_output_is_capped_keeps_the_tail_and_says_truncated(git_repo, rev, settings):
    flood = judge(git_repo, rev, {"run": "python -c \"print('x'*10_000_000)\""})
    text = evidence_text(flood)
    assert flood.verdict == "pass"
    assert len(text) < settings.FUSION_CHECK_OUTPUT_BYTES + 200
    assert "truncated" in text
    # "the tail is the evidence": what a failing test run prints last must survive.
    tail = judge(git_repo, rev, {"run": "python -c \"print('HEAD-MARK'); print('y'*200_000); print('TAIL-MARK')\""})
    assert "TAIL-MARK" in evidence_text(tail) and "HEAD-MARK" not in evidence_text(tail)
    assert len(evidence_text(tail)) < settings.FUSION_CHECK_OUTPUT_BYTES + 200


def test_environment_is_scrubbed_and_python_is_the_base_interpreter_not_the_services_venv(git_repo, rev, monkeypatch):
    monkeypatch.setenv("FUSION_TEST_SECRET", "s3cr3t-value-xyz")
    secret = judge(
        git_repo,
        rev,
        {
            "run": "python -c \"import os; print(os.environ.get('FUSION_TEST_SECRET','absent'))\"",
            "expect_output": r"^absent$",
        },
    )
    assert secret.verdict == "pass", secret
    assert "s3cr3t" not in evidence_text(secret)
    interpreter = judge(git_repo, rev, {"run": 'python -c "import sys; print(sys.prefix)"'})
    assert interpreter.verdict == "pass"
    assert evidence_text(interpreter).splitlines()[1] == sys.base_prefix  # docs/SANDBOX.md
    django = judge(git_repo, rev, {"run": 'python -c "import django"'})
    assert django.verdict == "fail" and "No module named 'django'" in evidence_text(django)


def test_shell_true_runs_a_pipeline_and_false_does_not(git_repo, rev):
    piped = judge(
        git_repo, rev, {"run": "python app.py | tr a-z A-Z", "shell": True, "expect_output": r"^HELLO WORLD$"}
    )
    assert piped.verdict == "pass", piped
    # Without a shell the `|` is just an argument: no pipeline, no upper case.
    unpiped = judge(git_repo, rev, {"run": "echo hello | tr a-z A-Z", "expect_output": r"HELLO"})
    assert unpiped.verdict == "fail"


# --- file checks ----------------------------------------------------------------


def test_file_exists_true_and_false(git_repo, rev):
    assert judge(git_repo, rev, {"file": "app.py", "exists": True}).verdict == "pass"
    missing = judge(git_repo, rev, {"file": "nope.py", "exists": True})
    assert missing.verdict == "fail" and missing.actual == "nope.py does not exist"
    assert judge(git_repo, rev, {"file": "nope.py", "exists": False}).verdict == "pass"
    present = judge(git_repo, rev, {"file": "app.py", "exists": False})
    assert present.verdict == "fail" and present.actual == "app.py exists"


def test_file_contains_names_the_matching_line(git_repo, rev):
    verdict = judge(git_repo, rev, {"file": "app.py", "contains": r"def greet\("})
    assert verdict.verdict == "pass"
    assert verdict.evidence[0].kind == "file" and evidence_text(verdict) == "app.py:3"
    anywhere = judge(git_repo, rev, {"file": "docs/notes.txt", "contains": r"remove"})
    assert anywhere.verdict == "pass" and evidence_text(anywhere) == "docs/notes.txt:2"
    absent = judge(git_repo, rev, {"file": "app.py", "contains": r"def farewell"})
    assert absent.verdict == "fail" and absent.actual == "no match"
    no_file = judge(git_repo, rev, {"file": "missing.txt", "contains": "x"})
    assert no_file.verdict == "fail" and no_file.actual == "missing.txt does not exist"
    assert no_file.evidence[0].kind == "other"  # a `file` evidence must name a file that exists


def test_file_not_contains(git_repo, rev):
    clean = judge(git_repo, rev, {"file": "app.py", "not_contains": r"TODO"})
    assert clean.verdict == "pass"
    dirty = judge(git_repo, rev, {"file": "docs/notes.txt", "not_contains": r"TODO"})
    assert dirty.verdict == "fail" and "line 2" in dirty.actual and evidence_text(dirty) == "docs/notes.txt:2"


def test_paths_cannot_leave_the_checkout(git_repo, rev, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret outside\n")
    os.symlink(str(outside), git_repo.path / "link.txt")
    escape = git_repo.commit({}, "symlink out")
    for check in ({"file": "link.txt", "exists": True}, {"file": "link.txt", "contains": "secret"}):
        verdict = judge(git_repo, escape, check)
        assert verdict.verdict == "fail", check
        assert "leaves the checkout" in verdict.actual, check
        assert verdict.evidence[0].kind == "other"
    # A path that names somewhere outside by its shape is a check the judge does not
    # understand: never a pass, not even for `exists: false` (it says nothing about the
    # checkout), and a path the OS cannot represent blocks instead of crashing the run.
    for check in (
        {"file": "../outside.txt", "exists": True},
        {"file": "../outside.txt", "contains": "secret"},
        {"file": str(outside), "exists": True},
        {"file": "../outside.txt", "exists": False},
        {"file": "hello\x00.py", "exists": True},
    ):
        verdict = judge(git_repo, escape, check)
        assert verdict.verdict == "blocked", check
        assert "the check is not understood" in verdict.message, check


# --- snapshots ------------------------------------------------------------------


def test_snapshot_is_the_revision_read_only_and_removed_even_when_the_body_raises(git_repo, rev):
    later = git_repo.commit({"app.py": "print('changed')\n"}, "later")
    with pytest.raises(RuntimeError, match="boom"), snapshot(str(git_repo.path), rev) as root:
        kept = root
        assert "greet" in (root / "app.py").read_text()  # the old revision, not HEAD
        mode = (root / "app.py").stat().st_mode
        assert not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        assert not (root / "docs/notes.txt").stat().st_mode & stat.S_IWUSR
        raise RuntimeError("boom")
    assert not kept.exists()
    assert str(kept) not in git_repo.git("worktree", "list")
    with snapshot(str(git_repo.path), later) as root:
        assert (root / "app.py").read_text() == "print('changed')\n"
        kept = root
    assert not kept.exists()


def test_non_git_folder_and_bad_revision_raise_snapshot_error(git_repo, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(SnapshotError, match="is not a git repository"), snapshot(str(plain), "HEAD"):
        pass
    with (
        pytest.raises(SnapshotError, match=f"commit {'0' * 40} is not in repository {git_repo.path}"),
        snapshot(str(git_repo.path), "0" * 40),
    ):
        pass
    with pytest.raises(SnapshotError, match="is not a revision name"), snapshot(str(git_repo.path), "--output=/tmp/x"):
        pass
    assert not Path("/tmp/x").exists()


# --- check shapes ---------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {"run": "pytest -q", "expect_exit": 0, "timeout": 120, "expect_output": r"\d+ passed"},
        {"run": "make test", "shell": True},
        {"file": "a/b.py", "exists": True},
        {"file": "a/b.py", "exists": False},
        {"file": "a/b.py", "contains": r"def \w+"},
        {"file": "a/b.py", "not_contains": "TODO"},
    ],
)
def test_check_spec_accepts_the_four_shapes(spec):
    assert check_spec_problems(spec) == []


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("pytest", "must be an object"),
        (["run", "x"], "must be an object"),
        ({}, "needs 'run' or 'file'"),
        ({"run": "x", "file": "y", "exists": True}, "not both"),
        ({"run": ""}, "non-empty command"),
        ({"run": 5}, "non-empty command"),
        ({"run": "x", "expect_exit": "0"}, "expect_exit must be an integer"),
        ({"run": "x", "expect_exit": True}, "expect_exit must be an integer"),
        ({"run": "x", "timeout": 0}, "timeout"),
        ({"run": "x", "timeout": 99999}, "timeout"),
        ({"run": "x", "timeout": "10"}, "timeout"),
        ({"run": "x", "shell": "yes"}, "shell must be true or false"),
        ({"run": "x", "expect_output": "("}, "not a valid regular expression"),
        ({"run": "x", "cwd": "/"}, "unknown key 'cwd'"),
        ({"file": "", "exists": True}, "relative path"),
        ({"file": "/etc/passwd", "exists": True}, "inside the checkout"),
        ({"file": "../x", "exists": True}, "inside the checkout"),
        ({"file": "a/../../x", "contains": "y"}, "inside the checkout"),
        ({"file": "a\x00b", "exists": True}, "NUL"),
        ({"file": "a"}, "exactly one of"),
        ({"file": "a", "exists": True, "contains": "x"}, "exactly one of"),
        ({"file": "a", "exists": "yes"}, "exists must be true or false"),
        ({"file": "a", "contains": "["}, "not a valid regular expression"),
        ({"file": "a", "not_contains": 3}, "regular expression string"),
        ({"file": "a", "exists": True, "run_as": "root"}, "unknown key 'run_as'"),
    ],
)
def test_check_spec_rejects_bad_shapes(spec, fragment):
    problems = check_spec_problems(spec)
    assert problems and any(fragment in p for p in problems), problems
