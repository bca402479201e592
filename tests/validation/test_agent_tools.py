"""The read-only tools: confined to the checkout, bounded, and refusals as answers."""

from __future__ import annotations

import os

import pytest

from tests.support.agent_env import hello_feature, run_now, scripted  # noqa: F401
from tests.support.verdicts import passing
from validation.context import AssertionSpec, ValidationContext
from validation.models import JournalEntry, RunStatus
from validation.validators import tools

SECRET = "TOP-SECRET-VALUE-42"


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "checkout"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("import os\n\ndef answer():\n    return 42\n")
    (root / "README.md").write_text("# hi\n" + "line\n" * 1000)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    os.symlink(outside / "secret.txt", root / "leak.txt")
    os.symlink(outside, root / "leakdir")
    os.symlink("pkg/mod.py", root / "inner.py")
    (root / ".git").write_text("gitdir: /somewhere/else\n")
    return root


def test_read_numbers_lines_and_pages(tree):
    out = tools.read(tree, "pkg/mod.py")
    assert out.splitlines()[:2] == ["1: import os", "2: "]
    page = tools.read(tree, "README.md", offset=10, limit=5)
    assert page.splitlines()[0] == "10: line" and "more lines; read with offset=15" in page


@pytest.mark.parametrize(
    "path",
    [
        "../outside/secret.txt",
        "/etc/passwd",
        "leak.txt",
        "leakdir/secret.txt",
        "pkg/../../outside/secret.txt",
        ".git",
        "nope.py",
        "a\x00b",
    ],
)
def test_read_refuses_escapes_and_non_files(tree, path):
    out = tools.read(tree, path)
    assert out.startswith("refused:") and SECRET not in out


@pytest.mark.parametrize("path", ["..", "/", "leakdir", "../outside"])
def test_ls_refuses_outside_directories(tree, path):
    out = tools.ls(tree, path)
    assert out.startswith("refused:") and "secret.txt" not in out


def test_ls_marks_symlinks_and_hides_metadata(tree):
    listing = tools.ls(tree).splitlines()
    assert "leak.txt -> (symlink)" in listing and "pkg/" in listing and ".git" not in "".join(listing)


def test_grep_and_find_never_follow_links_out(tree):
    assert SECRET not in tools.grep(tree, "SECRET|answer")
    assert tools.grep(tree, "def answer") == "inner.py:3: def answer():\npkg/mod.py:3: def answer():"
    found = tools.find(tree, "*.txt")
    assert "leak.txt" not in found and "secret" not in found
    assert tools.find(tree, "*.py").splitlines() == ["inner.py", "pkg/mod.py"]
    assert tools.grep(tree, "(").startswith("refused: invalid regular expression")


def test_outputs_are_bounded_and_redacted(tree):
    (tree / "big.txt").write_text(("x" * 400 + "\n") * 2000)
    assert len(tools.read(tree, "big.txt", limit=400)) <= tools.MAX_OUTPUT + 100
    (tree / "conf.py").write_text("API_KEY = 'sk-abcdefghijklmnopqrstuvwx'\n")
    assert "sk-abc" not in tools.read(tree, "conf.py")


def test_run_check_runs_only_declared_checks(tree):
    specs = [
        AssertionSpec("VAL-1", "t", "s", {"file": "pkg/mod.py", "contains": "def answer"}),
        AssertionSpec("VAL-2", "t", "s", None),
    ]
    ctx = ValidationContext(
        run_id=0,
        mission_key="m",
        feature_key="f",
        feature_title="F",
        feature_description="",
        assertions=specs,
        revision="r",
        checkout=tree,
        profile={"name": "agent"},
    )
    assert '"verdict": "pass"' in tools.run_check(ctx, "VAL-1")
    assert tools.run_check(ctx, "VAL-2").startswith("refused: VAL-2 has no declared check")
    assert tools.run_check(ctx, "rm -rf /").startswith("refused:")


def test_run_check_runs_in_a_private_copy(tree, settings, tmp_path):
    """The agent's run_check is judged as the host judges: what the check deletes stays in
    its own copy, the checkout the agent reads is untouched."""
    settings.FUSION_SNAPSHOT_DIR = tmp_path / "snapshots"
    specs = [AssertionSpec("VAL-1", "t", "s", {"run": "rm inner.py"})]
    ctx = ValidationContext(
        run_id=0,
        mission_key="m",
        feature_key="f",
        feature_title="F",
        feature_description="",
        assertions=specs,
        revision="r",
        checkout=tree,
        profile={"name": "agent"},
    )
    assert '"verdict": "pass"' in tools.run_check(ctx, "VAL-1")
    assert (tree / "inner.py").is_file()


@pytest.mark.django_db(transaction=True)
def test_agent_escape_attempts_are_refused_in_a_real_run(scripted, hello_feature, git_repo, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text(SECRET)
    os.symlink(outside, git_repo.path / "leak.txt")
    fn = scripted(
        [
            (
                "tools",
                [
                    ("read", {"path": "../secret.txt"}),
                    ("read", {"path": str(outside)}),
                    ("read", {"path": "leak.txt"}),
                    ("ls", {"path": ".."}),
                    ("grep", {"pattern": "SECRET", "path": "."}),
                    ("find", {"pattern": "*"}),
                ],
            ),
            ("verdict", passing("VAL-1")),
        ]
    )
    run = run_now(hello_feature([("VAL-1", None)]))
    assert run.status == RunStatus.PASSED, run.error
    results = [e.payload["output"] for e in JournalEntry.objects.filter(run=run, kind="tool_result").order_by("seq")]
    assert len(results) == 6
    assert all(r.startswith("refused:") for r in results[:4]), results
    assert results[4] == "(no match)" and "leak.txt" not in results[5]
    assert SECRET not in fn.calls[1]["text"]
