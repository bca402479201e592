"""The shape of a declared environment (docs/ENVIRONMENTS.md): what a mission, or a
milestone overriding it, sets up once before its checks run, the way CI declares its set-up.

Every writer (API, admin, mission files, services) refuses what `environment_problems`
refuses; the runner reads `effective` (the declaration with its defaults)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from missions.checks_spec import pattern_problems

PRESETS = ("none", "python", "node")
KEYS = ("preset", "setup", "key_files", "path")
# The files whose content keys the cache when the declaration names none.
DEFAULT_KEY_FILES = {
    "none": [],
    "python": ["requirements*.txt", "pyproject.toml", "setup.cfg", "setup.py", "uv.lock", "poetry.lock"],
    "node": ["package.json", "package-lock.json", "npm-shrinkwrap.json"],
}
# The environment's folders put first on PATH (relative to the environment's folder).
DEFAULT_PATH = {"none": [], "python": ["venv/bin"], "node": ["node_modules/.bin"]}
MAX_SETUP = 50
MAX_COMMAND_CHARS = 4000
MAX_PATH = 20


def environment_problems(value: Any) -> list[str]:
    """What is wrong with a declaration, each problem naming its place (`setup[1]: …`);
    `{}` declares none."""
    if not isinstance(value, dict):
        return ["must be a mapping (preset, setup, key_files, path)"]
    problems = [f"{name}: unknown field" for name in value if name not in KEYS]
    preset = value.get("preset", "none")
    if preset not in PRESETS:
        problems.append(f"preset: must be one of {', '.join(PRESETS)}")
    problems += _commands_problems(value.get("setup", []))
    if "key_files" in value:
        problems += pattern_problems(value["key_files"], "key_files")
    problems += _path_problems(value.get("path", []))
    return problems


def _commands_problems(setup: Any) -> list[str]:
    if not isinstance(setup, list):
        return ["setup: must be a list of shell commands"]
    if len(setup) > MAX_SETUP:
        return [f"setup: at most {MAX_SETUP} commands"]
    return [
        f"setup[{i}]: must be a non-empty string of at most {MAX_COMMAND_CHARS} characters without NUL"
        for i, command in enumerate(setup)
        if not isinstance(command, str) or not command.strip() or len(command) > MAX_COMMAND_CHARS or "\x00" in command
    ]


def _path_problems(path: Any) -> list[str]:
    if not isinstance(path, list) or len(path) > MAX_PATH:
        return [f"path: must be a list of at most {MAX_PATH} folders of the environment"]
    problems = []
    for i, folder in enumerate(path):
        pure = PurePosixPath(folder) if isinstance(folder, str) and folder.strip() and "\x00" not in folder else None
        if pure is None or pure.is_absolute() or ".." in pure.parts or ":" in folder:
            problems.append(f"path[{i}]: must be a folder relative to the environment's folder (no `..`, no `:`)")
    return problems


def effective(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """The declaration with every default filled in, or None when it declares nothing to
    build (no preset and no setup). Only for a declaration without problems."""
    if not value:
        return None
    preset = value.get("preset", "none")
    setup = list(value.get("setup", []))
    if preset == "none" and not setup:
        return None
    return {
        "preset": preset,
        "setup": setup,
        "key_files": list(value.get("key_files", DEFAULT_KEY_FILES[preset])),
        "path": list(value.get("path", DEFAULT_PATH[preset])),
    }


def declared_for(mission_environment: dict[str, Any] | None, milestone_environment: dict[str, Any] | None) -> Any:
    """The declaration a run of a milestone uses: the milestone's own when it has one
    (a mapping, `{}` included: none), else the mission's (`null`: inherit)."""
    return mission_environment if milestone_environment is None else milestone_environment
