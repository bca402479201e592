"""The verdict contract (docs/TRUTH.md, docs/validators.md) and its host validators.

Host validators are pure functions of (candidate, frozen context). All of them run, in a
fixed order, on every candidate; each returns a list of problems that name the exact
offending keys. A validator that raises is a host defect (`HostValidatorDefect`), never
a verdict. The overall status is always recomputed from the per-assertion verdicts.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_TEXT = 20_000

# One assertion's (or a whole verdict's) outcome, and what an evidence item is.
Outcome = Literal["pass", "fail", "blocked"]
EvidenceKind = Literal["file", "command", "test-output", "other"]


class Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: EvidenceKind
    text: str = Field(max_length=MAX_TEXT)


class AssertionVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    verdict: Outcome
    message: str = Field(default="", max_length=MAX_TEXT)
    expected: str = Field(default="", max_length=MAX_TEXT)
    actual: str = Field(default="", max_length=MAX_TEXT)
    evidence: list[Evidence] = Field(default_factory=list)


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Outcome
    summary: str = Field(default="", max_length=MAX_TEXT)
    blocked_reason: str = Field(default="", max_length=MAX_TEXT)
    assertions: list[AssertionVerdict]


@dataclass(frozen=True)
class FrozenContext:
    """What host validators may look at: the linked keys and the checkout. `file_refs`:
    the file evidence already judged against the checkout (text -> problem, None when
    sound) before a check ran in it (docs/TRUTH.md, "Checks see the revision and nothing
    else"); a file evidence not among them is refused."""

    keys: tuple[str, ...]
    checkout: Path | None = None
    file_refs: Mapping[str, str | None] | None = None


@dataclass
class HostReport:
    problems: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.problems.values())

    def reasons(self) -> list[str]:
        return [f"{name}: {p}" for name, items in self.problems.items() for p in items]


class HostValidatorDefect(Exception):
    """A host validator raised: the host is broken, the candidate is not judged."""


def overall_status(assertions: list[AssertionVerdict]) -> str:
    if not assertions:  # nothing judged is never a pass (docs/TRUTH.md)
        return "blocked"
    verdicts = {a.verdict for a in assertions}
    if "blocked" in verdicts:
        return "blocked"
    if "fail" in verdicts:
        return "fail"
    return "pass"


# --- host validators (fixed order) -------------------------------------------------------


def keys_accounted(v: Verdict, ctx: FrozenContext) -> list[str]:
    problems = []
    seen: dict[str, int] = {}
    for a in v.assertions:
        seen[a.key] = seen.get(a.key, 0) + 1
    for key in ctx.keys:
        if key not in seen:
            problems.append(f"{key}: missing; every linked assertion must be judged exactly once")
    for key, count in seen.items():
        if key not in ctx.keys:
            problems.append(f"{key}: unknown assertion key; judge only {', '.join(ctx.keys)}")
        elif count > 1:
            problems.append(f"{key}: judged {count} times; judge it exactly once")
    return problems


def failures_explained(v: Verdict, ctx: FrozenContext) -> list[str]:
    problems = []
    for a in v.assertions:
        if a.verdict == "fail":
            blank = [name for name in ("expected", "actual", "message") if not getattr(a, name).strip()]
            if blank:
                problems.append(f"{a.key}: a fail needs non-blank {', '.join(blank)}")
    return problems


def evidence_present(v: Verdict, ctx: FrozenContext) -> list[str]:
    return [
        f"{a.key}: cite at least one evidence item" for a in v.assertions if not any(e.text.strip() for e in a.evidence)
    ]


FILE_REF = re.compile(r"^(?P<path>[^\s:]+?)(?::(?P<line>\d+))?(?:[:\s].*)?$", re.S)
# After a quoted path (a JSON string): an optional :line, then the rest of the text.
AFTER_QUOTED = re.compile(r"(?::(?P<line>\d+))?(?:[:\s].*)?$", re.S)


def read_checkout_text(path: Path) -> str:
    """A checkout file as text: undecodable bytes replaced, line endings kept as they are
    (a check for a stray `\r` must see it)."""
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        return fh.read()


def line_of(text: str, offset: int) -> int:
    """The 1-based line holding `text[offset]`. `\r\n`, `\r` and `\n` each end one line,
    for the checks validator and the host validator alike; an offset inside a line break,
    or at the very end, belongs to the line that break ends."""
    if offset == len(text) and text.endswith(("\r", "\n")):
        offset -= 1
    if 0 < offset < len(text) and text[offset - 1 : offset + 1] == "\r\n":
        offset -= 1
    return text.count("\n", 0, offset) + text.count("\r", 0, offset) - text.count("\r\n", 0, offset) + 1


def line_count(text: str) -> int:
    return line_of(text, len(text)) if text else 0


def escape_invisible(text: str) -> str:
    """Invisible characters as JSON-style `\\uXXXX` escapes (a surrogate pair beyond the
    BMP), and a byte of a file name that is not UTF-8 as `\\xNN` (`escape_undecodable`)."""
    if not _invisible_in(text):
        return text
    return _json_escaped(escape_undecodable(text))


def _json_escaped(text: str) -> str:
    return "".join(json.dumps(ch)[1:-1] if unicodedata.category(ch) in INVISIBLE else ch for ch in text)


# A byte that is not UTF-8, as `os.fsdecode` keeps it in a path: a lone surrogate.
UNDECODABLE = re.compile("[\udc80-\udcff]")


def escape_undecodable(text: str) -> str:
    """Each undecodable byte of a path as `\\xNN`, visibly: a lone surrogate can be neither
    stored (PostgreSQL refuses it) nor shown."""
    return UNDECODABLE.sub(lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", text)


def file_ref(path: str, line: int | None = None) -> str:
    """File evidence naming `path` (and `line`) as `file_ref_problem` reads it back: a path
    with whitespace, a colon, a quote, a backslash or an invisible character is quoted (a
    byte that is not UTF-8 as the JSON escape `\\udcNN`, which reads back to the same file)."""
    plain = bool(path) and not any(ch.isspace() or ch in ':"\\' for ch in path) and not _invisible_in(path)
    text = path if plain else _json_escaped(json.dumps(path, ensure_ascii=False))
    return text if line is None else f"{text}:{line}"


def _split_file_ref(text: str) -> tuple[str, str | None] | None:
    if text.startswith('"'):
        try:
            rel, end = json.JSONDecoder().raw_decode(text)
        except ValueError:
            return None
        rest = AFTER_QUOTED.match(text, end)
        return (rel, rest.group("line")) if isinstance(rel, str) and rest else None
    match = FILE_REF.match(text)
    return (match.group("path"), match.group("line")) if match else None


def file_evidence_exists(v: Verdict, ctx: FrozenContext) -> list[str]:
    if ctx.checkout is None:
        return []
    root = ctx.checkout.resolve()
    problems = []
    for a in v.assertions:
        for e in a.evidence:
            if e.kind != "file":
                continue
            text = e.text.strip()
            if ctx.file_refs is None:
                problem = file_ref_problem(root, text)
            else:
                problem = ctx.file_refs.get(text, f"file evidence {text[:80]!r} was not read before a check ran")
            if problem:
                problems.append(f"{a.key}: {problem}")
    return problems


def file_refs_of(verdicts: Iterable[AssertionVerdict], checkout: Path) -> dict[str, str | None]:
    """Each file evidence of `verdicts`, judged against `checkout` as it is now."""
    root = checkout.resolve()
    texts = {e.text.strip() for v in verdicts for e in v.evidence if e.kind == "file"}
    return {text: file_ref_problem(root, text) for text in texts}


def file_ref_problem(root: Path, text: str) -> str | None:
    ref = _split_file_ref(text)
    if ref is None:
        return f'file evidence {text[:80]!r} must start with path, path:line or "quoted path":line'
    rel, line = ref
    try:
        target = (root / rel).resolve()
    except (ValueError, OSError):
        target = None
    if target is None or not target.is_relative_to(root) or not target.is_file():
        return f"file evidence names {rel!r}, which is not a file in the checkout"
    if line is not None:
        count = line_count(read_checkout_text(target))
        if not 1 <= int(line) <= max(count, 1):
            return f"file evidence {rel}:{line} is past the end of the file ({count} lines)"
    return None


INVISIBLE = {"Cf", "Co", "Cs"}


def _invisible_in(text: str) -> bool:
    # No ASCII character is in these categories (ASCII's controls are Cc): most texts are
    # answered without looking at each character.
    return not text.isascii() and any(unicodedata.category(ch) in INVISIBLE for ch in text)


def no_invisible_characters(v: Verdict, ctx: FrozenContext) -> list[str]:
    problems = []
    if _invisible_in(v.summary) or _invisible_in(v.blocked_reason):
        problems.append("summary: contains invisible format characters")
    for a in v.assertions:
        texts = [a.key, a.message, a.expected, a.actual, *(e.text for e in a.evidence)]
        if any(_invisible_in(t) for t in texts):
            problems.append(f"{a.key}: contains invisible format characters")
    return problems


HOST_VALIDATORS: tuple[tuple[str, Callable[[Verdict, FrozenContext], list[str]]], ...] = (
    ("keys_accounted", keys_accounted),
    ("failures_explained", failures_explained),
    ("evidence_present", evidence_present),
    ("file_evidence_exists", file_evidence_exists),
    ("no_invisible_characters", no_invisible_characters),
)


def run_host_validators(v: Verdict, ctx: FrozenContext, validators=HOST_VALIDATORS) -> HostReport:
    report = HostReport()
    for name, fn in validators:  # all of them, no short-circuit
        try:
            problems = fn(v, ctx)
        except Exception as exc:  # noqa: BLE001
            raise HostValidatorDefect(f"host validator {name} raised {type(exc).__name__}: {exc}") from exc
        if problems:
            report.problems[name] = list(problems)
    return report


def parse_candidate(data: Any) -> tuple[Verdict | None, list[str]]:
    """Schema-check a candidate document; problems are phrased for a repair turn."""
    try:
        return Verdict.model_validate(data), []
    except ValidationError as exc:
        return None, [
            f"{'.'.join(str(p) for p in err['loc']) or '(document)'}: {err['msg']}" for err in exc.errors()[:20]
        ]


def normalize(v: Verdict) -> Verdict:
    """The stored verdict: status recomputed from per-assertion verdicts."""
    status = overall_status(v.assertions)
    blocked_reason = v.blocked_reason
    if status == "blocked" and not v.assertions:
        blocked_reason = "no assertions to judge: a verdict over an empty set never passes"
    elif status == "blocked" and not blocked_reason.strip():
        blocked_reason = "; ".join(f"{a.key}: {a.message}" for a in v.assertions if a.verdict == "blocked")[:2000]
    return v.model_copy(update={"status": status, "blocked_reason": blocked_reason if status == "blocked" else ""})
