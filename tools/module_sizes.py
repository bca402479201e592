"""`make lint`'s bound on a module's length (docs/ARCHITECTURE.md, "Sizes"): every module
of the apps (`forges/`, `missions/`, `validation/`, `fusion_site/`) has at most 400 lines, migrations
and tests aside. Each module past it is named with its length; the exit status is 1.

    python tools/module_sizes.py [ROOT]     (ROOT: the checkout, by default this one)
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_LINES = 400
APPS = ("forges", "missions", "validation", "fusion_site")


def measured(path: Path) -> bool:
    """A module the bound applies to: not a migration, not a test."""
    return "migrations" not in path.parts and "tests" not in path.parts and not path.name.startswith("test_")


def oversized(root: Path) -> list[tuple[str, int]]:
    """(path relative to `root`, lines) of each module past MAX_LINES, by path."""
    found = []
    for app in APPS:
        for path in (root / app).rglob("*.py"):
            rel = path.relative_to(root)
            if measured(rel):
                lines = len(path.read_text(encoding="utf-8").splitlines())
                if lines > MAX_LINES:
                    found.append((rel.as_posix(), lines))
    return sorted(found)


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    found = oversized(root)
    for rel, lines in found:
        print(
            f"{rel}: {lines} lines, more than {MAX_LINES}: split it where its sections are (docs/ARCHITECTURE.md, Sizes)"
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
