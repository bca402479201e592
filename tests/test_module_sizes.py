"""`make lint`'s bound on a module's length (tools/module_sizes.py, docs/ARCHITECTURE.md
"Sizes"): a module of the apps past 400 lines is named with its length and fails the lint;
migrations and tests are not measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "module_sizes.py"


def _module(root: Path, rel: str, lines: int) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"x{i} = {i}\n" for i in range(lines)))


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=60)


def test_a_module_past_400_lines_is_named_and_fails_the_lint(tmp_path):
    _module(tmp_path, "validation/long.py", 401)
    _module(tmp_path, "missions/services/at_the_bound.py", 400)
    _module(tmp_path, "fusion_site/runtime/longer.py", 450)
    result = _run(tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "fusion_site/runtime/longer.py: 450 lines, more than 400: split it where its sections are"
        " (docs/ARCHITECTURE.md, Sizes)",
        "validation/long.py: 401 lines, more than 400: split it where its sections are (docs/ARCHITECTURE.md, Sizes)",
    ]


def test_migrations_and_tests_are_not_measured(tmp_path):
    _module(tmp_path, "missions/migrations/0001_initial.py", 900)
    _module(tmp_path, "validation/tests/test_long.py", 900)
    _module(tmp_path, "fusion_site/test_settings_case.py", 900)
    _module(tmp_path, "missions/short.py", 10)
    result = _run(tmp_path)
    assert (result.returncode, result.stdout) == (0, "")
