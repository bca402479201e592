"""Read-only tools for candidate reviewers: `read`, `grep`, `find`, `ls` on the review's
snapshot.

The confinement, bounds and secret redaction are the agent validator's
(`validation.validators.tools`); this module only binds them to one snapshot directory
as typed functions that pydantic-ai can offer to a model. Nothing here writes or runs
anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from validation.validators import tools as confined

TOOL_NAMES = ("read", "grep", "find", "ls")


def make_tools(root: Path) -> list[Callable[..., str]]:
    root = Path(root).resolve()

    def read(path: str, offset: int = 1, limit: int = 200) -> str:
        """Read a text file of the repository (paths relative to its root); lines are numbered from `offset`."""
        return confined.read(root, path, offset, limit)

    def grep(pattern: str, path: str = ".", glob: str = "*") -> str:
        """Search the files under `path` whose name matches `glob` for a Python regular expression."""
        return confined.grep(root, pattern, path, glob)

    def find(pattern: str = "*", path: str = ".") -> str:
        """List the files under `path` whose relative path or name matches the glob `pattern`."""
        return confined.find(root, pattern, path)

    def ls(path: str = ".") -> str:
        """List one directory of the repository (directories end with /)."""
        return confined.ls(root, path)

    return [read, grep, find, ls]
