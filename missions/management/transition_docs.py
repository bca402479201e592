"""The transition tables in the docs, written from `missions.transitions.tables.TRANSITIONS`
(`manage.py transition_tables`). A doc holds a table between two markers,

    <!-- transitions:NAME -->
    ...written here...
    <!-- /transitions:NAME -->

and everything between them is generated: one row per move, the old states that share
its target, causes and event merged into one row, then the states with no move out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from missions.transitions.tables import TRANSITIONS, Table

DOCS = ("docs/ARCHITECTURE.md", "docs/TRUTH.md")

BLOCK = re.compile(r"(<!-- transitions:(?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- /transitions:(?P=name) -->)", re.S)


def _code(values: Iterable[str]) -> str:
    return ", ".join(f"`{value}`" for value in values)


def _rows(table: Table) -> list[tuple[str, str, str, str]]:
    """(from, to, causes, event) rows: the moves that differ only in their old state share one."""
    merged: dict[tuple[str, str, str], list[str]] = {}
    for old, moves in table.items():
        for new, entry in moves.items():
            if isinstance(entry, str):
                by_event = {entry: "any"}
            else:
                causes: dict[str, list[str]] = {}
                for cause, event in entry.items():
                    causes.setdefault(event, []).append(cause)
                by_event = {event: _code(sorted(names)) for event, names in causes.items()}
            for event, causes_text in by_event.items():
                merged.setdefault((new, causes_text, event), []).append(old)
    return [(_code(olds), f"`{new}`", causes, f"`{event}`") for (new, causes, event), olds in merged.items()]


def render(name: str) -> str:
    """The text between the markers of table `name`."""
    field, table = TRANSITIONS[name]
    lines = [
        f"`{field}` (`missions/transitions/tables.py`, written here by `manage.py transition_tables`):",
        "",
        "| from | to | cause | event |",
        "|---|---|---|---|",
        *(f"| {old} | {new} | {causes} | {event} |" for old, new, causes, event in _rows(table)),
    ]
    final = [state for state, moves in table.items() if not moves]
    if final:
        lines += ["", f"Final (no move out): {_code(final)}."]
    return "\n".join(lines) + "\n"


def rewritten(text: str) -> str:
    """`text` with every marked table written anew; an unknown name raises KeyError."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("name")) + m.group(4), text)


def stale_docs(root: Path, *, write: bool) -> list[str]:
    """The docs whose tables differ from the generated text (written anew when `write`)."""
    stale = []
    for relative in DOCS:
        path = root / relative
        text = path.read_text()
        new = rewritten(text)
        if new != text:
            stale.append(relative)
            if write:
                path.write_text(new)
    return stale
