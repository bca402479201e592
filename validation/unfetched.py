"""A check that read what the snapshot could not hold is blocked, not judged
(docs/TRUTH.md, "Checks see the revision and nothing else"): a Git LFS pointer instead of
the file's content, or the empty folder of a submodule that was not checked out. The
implementation is not at fault, and a pass on a pointer (`not_contains`) would be false.

- A file check whose file is an LFS pointer is `blocked` (`lfs_not_fetched`), unless it
  asks only whether the file exists: the pointer is the committed file, so that answer
  stands. A file check on a path inside an empty submodule is `blocked`
  (`submodule_not_fetched`), whatever it asks: even "does not exist" cannot be told.
- A run check reads whatever it likes: when it fails and the commit holds an empty
  submodule or an LFS pointer in the mission's folder, nobody can tell whether the
  implementation or the missing content failed it, so it is `blocked`. A run check that
  passes stays passed: it did what it was asked with what was there.

The block's first evidence item is `<code>: …`: `stop_code` reads it back, from the
host's own checks only, to set the feature's stop reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fusion_site.repos.tree_index import TreeFacts, is_lfs_pointer
from validation.verdict import AssertionVerdict, Evidence, Verdict, escape_invisible

SUBMODULE_NOT_FETCHED = "submodule_not_fetched"
LFS_NOT_FETCHED = "lfs_not_fetched"
CODES = (SUBMODULE_NOT_FETCHED, LFS_NOT_FETCHED)
LFS_HELP = (
    "this service does not fetch Git LFS objects yet (docs/REPOSITORIES.md, 'Git LFS'): "
    "commit the content itself, or judge it with a check that does not read it"
)
LISTED = 5  # paths named in a message; the rest are counted


def file_rule(
    verdict: AssertionVerdict, spec: dict[str, Any], target: Path | None, rel: str, facts: TreeFacts | None
) -> AssertionVerdict:
    """A file check's verdict (`target`: the file it read, `rel` its path in the mission's folder)."""
    if target is None:
        return verdict  # a path that leaves the checkout is refused as it is
    if target.is_file():
        if "exists" not in spec and is_lfs_pointer(target):
            return _blocked(verdict, LFS_NOT_FETCHED, f"{rel} is a Git LFS pointer, not the file's content: {LFS_HELP}")
        return verdict
    around = facts.unpopulated_around(rel) if facts is not None else None
    if around is None:
        return verdict
    link, why = around
    return _blocked(verdict, SUBMODULE_NOT_FETCHED, f"{rel} lies in submodule {link}, which is empty: {why}")


def run_rule(verdict: AssertionVerdict, facts: TreeFacts | None) -> AssertionVerdict:
    """A run check's verdict: a fail on a tree with missing content is blocked."""
    if verdict.verdict != "fail" or facts is None:
        return verdict
    empty = facts.in_folder(facts.unpopulated())
    if empty:
        whys = sorted(set(empty.values()))
        detail = f"the commit's submodules {_listed(empty)} are empty ({'; '.join(whys)})"
        return _blocked(verdict, SUBMODULE_NOT_FETCHED, f"{detail}; the failure may be theirs, not the code's")
    pointers = facts.lfs_pointers()
    if pointers:
        detail = (
            f"the commit's files {_listed(pointers)} are Git LFS pointers; the failure may be theirs, not the code's"
        )
        return _blocked(verdict, LFS_NOT_FETCHED, f"{detail}: {LFS_HELP}")
    return verdict


def _listed(paths: Iterable[str]) -> str:
    names = sorted(paths)
    shown = ", ".join(names[:LISTED])
    return shown + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")


def _blocked(verdict: AssertionVerdict, code: str, detail: str) -> AssertionVerdict:
    # Paths may hold invisible characters: escaped, as in every verdict of the host's own.
    detail = escape_invisible(detail)
    outcome = {"pass": "passed", "fail": "failed"}.get(verdict.verdict, "was blocked")
    return verdict.model_copy(
        update={
            "verdict": "blocked",
            "message": f"{code}: {detail}"[:2000],
            "actual": f"not judged (the check itself {outcome}): {verdict.actual}"[:2000],
            "evidence": [Evidence(kind="other", text=f"{code}: {detail}"[:4000]), *verdict.evidence],
        }
    )


def stop_code(verdict: Verdict, checked: Iterable[str]) -> str:
    """The code of the first blocked assertion the host's own check blocked for missing
    content ('' when none): `checked` are the keys with a check, whose verdict only the
    host writes (a model's evidence comes after the check's, docs/TRUTH.md)."""
    keys = set(checked)
    for item in verdict.assertions:
        if item.verdict == "blocked" and item.key in keys and item.evidence:
            code = item.evidence[0].text.partition(":")[0]
            if code in CODES and item.evidence[0].kind == "other":
                return code
    return ""
