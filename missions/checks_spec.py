"""The shapes an assertion's deterministic `check` may take (docs/MISSION_FILES.md).

Every writer (API, mission files, admin, services) and the judge itself go through
`check_spec_problems`: a check it finds a problem in is never run."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

# `network`: the check reaches the network from its sandbox (docs/SANDBOX.md).
RUN_KEYS = {"run", "expect_exit", "timeout", "expect_output", "shell", "protect", "network"}
FILE_KEYS = {"file", "exists", "contains", "not_contains", "protect"}
MAX_TIMEOUT = 3600


def _regex_problem(name: str, value: Any) -> list[str]:
    if not isinstance(value, str):
        return [f"{name} must be a regular expression string"]
    try:
        re.compile(value)
    except re.error as exc:
        return [f"{name} is not a valid regular expression: {exc}"]
    return []


def _relative_problem(name: str, path: str) -> str | None:
    if "\x00" in path:
        return f"{name} must not contain a NUL character"
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        return f"{name} must be a relative path inside the checkout"
    return None


MAX_PATTERNS = 200
MAX_PATTERN_CHARS = 500


def pattern_problems(patterns: Any, name: str = "protected_paths") -> list[str]:
    """What is wrong with a list of protected path patterns (a mission's `protected_paths`,
    a check's `protect`), each problem prefixed by `name[i]`. Patterns are relative to the
    workspace folder."""
    if not isinstance(patterns, list):
        return [f"{name}: must be a list of glob patterns"]
    if len(patterns) > MAX_PATTERNS:
        return [f"{name}: at most {MAX_PATTERNS} patterns"]
    return [f"{name}[{i}]: {problem}" for i, pattern in enumerate(patterns) if (problem := _pattern_problem(pattern))]


def _pattern_problem(pattern: Any) -> str | None:
    if not isinstance(pattern, str) or not pattern.strip():
        return "must be a non-empty string"
    if "\x00" in pattern:
        return "must not contain a NUL character"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"must be at most {MAX_PATTERN_CHARS} characters"
    pure = PurePosixPath(pattern)
    if pure.is_absolute():
        return "must be relative to the workspace, not an absolute path"
    if ".." in pure.parts:
        return "must not contain `..`"
    return None


def _protect_problems(spec: dict) -> list[str]:
    return pattern_problems(spec["protect"], "protect") if "protect" in spec else []


def _run_problems(spec: dict) -> list[str]:
    problems = [f"unknown key {k!r} in a run check" for k in sorted(set(spec) - RUN_KEYS)]
    if not isinstance(spec["run"], str) or not spec["run"].strip():
        problems.append("run must be a non-empty command string")
    if "expect_exit" in spec and (not isinstance(spec["expect_exit"], int) or isinstance(spec["expect_exit"], bool)):
        problems.append("expect_exit must be an integer")
    timeout = spec.get("timeout", 1)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= MAX_TIMEOUT:
        problems.append(f"timeout must be a number of seconds between 0 and {MAX_TIMEOUT}")
    if "shell" in spec and not isinstance(spec["shell"], bool):
        problems.append("shell must be true or false")
    if "network" in spec and not isinstance(spec["network"], bool):
        problems.append("network must be true or false")
    if "expect_output" in spec:
        problems += _regex_problem("expect_output", spec["expect_output"])
    return problems + _protect_problems(spec)


def _file_problems(spec: dict) -> list[str]:
    problems = [f"unknown key {k!r} in a file check" for k in sorted(set(spec) - FILE_KEYS)]
    path = spec["file"]
    if not isinstance(path, str) or not path.strip():
        return problems + ["file must be a relative path"]
    if problem := _relative_problem("file", path):
        problems.append(problem)
    tests = [k for k in ("exists", "contains", "not_contains") if k in spec]
    if len(tests) != 1:
        problems.append("a file check needs exactly one of exists, contains, not_contains")
    if "exists" in spec and not isinstance(spec["exists"], bool):
        problems.append("exists must be true or false")
    for name in ("contains", "not_contains"):
        if name in spec:
            problems += _regex_problem(name, spec[name])
    return problems + _protect_problems(spec)


def check_spec_problems(spec: Any) -> list[str]:
    if not isinstance(spec, dict):
        return ["a check must be an object"]
    if not all(isinstance(key, str) for key in spec):
        return ["a check's keys must be strings"]
    if "run" in spec and "file" in spec:
        return ["a check is either a run check or a file check, not both"]
    if "run" in spec:
        return _run_problems(spec)
    if "file" in spec:
        return _file_problems(spec)
    return ["a check needs 'run' or 'file'"]
