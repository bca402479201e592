"""The per-run verdict schema of the `schema` output mode (docs/validators.md, "`schema`").

A model server that decodes under a JSON schema cannot emit a key the schema does not
allow, so the schema a run sends is the verdict THIS run needs: the frozen assertion keys
as the only, and required, properties of an object (each key once, by construction),
`verdict` an enum, a fail's `expected`/`actual`/`message` non-blank, at least one evidence
item, and file evidence naming only files of the checkout and only lines they have. The
model never states the overall status: the host derives it. Strings and evidence lists
are bounded (`TEXT_MAX`, `EVIDENCE_MAX`), so that a whole answer fits a model's output
budget.

The model's answer is in that keyed form; `to_contract` turns it into the contract's list
form, which then goes through the same schema check and host validators as every other
candidate. Nothing here decides a verdict: a guaranteed shape only saves repair turns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from validation.verdict import UNDECODABLE, file_ref, line_count, read_checkout_text

# Part of every schema-mode fingerprint (profiles.public_config): a change of what the
# schema says is a change of the validator, so an old pass is not reused for it.
SCHEMA_VERSION = 2
SCHEMA_NAME = "verdict"
# The `schema_format`s: the forms of `response_format` (and the schema keywords) servers take.
DIALECTS = ("openai", "llama_cpp")
# A checkout with more files than this gets free-form file paths (the host still checks
# them): an enum of thousands of paths would swamp a grammar-compiling server. The
# assertion's schema is written once (`$defs`) and referenced under every key.
MAX_ENUM_FILES = 200
OTHER_KINDS = ("command", "test-output", "other")
# Bounds that make a complete answer short (llama_cpp, whose compiler takes `maxLength`,
# where OpenAI's strict mode does not): a model that keeps writing one string would
# otherwise run into `max_tokens` and hand over a cut-off document, which no repair
# shortens. The host's own limit (validation/verdict.py, MAX_TEXT) is far above them.
TEXT_MAX = 200
SUMMARY_MAX = 300
EVIDENCE_MAX = 3
# llama.cpp's compiler ignores `maximum`: there a file's line numbers are an enum, up to
# this many lines (a longer file's line is left to the host); OpenAI takes `maximum`.
LINE_ENUM_MAX = 300
LINE_ENUM_TOTAL = 1000  # line numbers in all the enums of one schema
# "pattern" (strings without quotes, backslashes or control characters) or "lenient"
# (any string; the host reads raw control characters): see `_text`. Against SmolLM2-135M
# under llama-cpp-python 0.3.36, "pattern" had every first answer accepted and "lenient"
# 6 of 10 (docs/validators.md, "Measured").
LLAMA_STRINGS = "pattern"


def checkout_files(checkout: Path | None, *, limit: int = MAX_ENUM_FILES) -> dict[str, int] | None:
    """The files file evidence may name, as the host reads a reference back (a path that
    resolves to a file inside the checkout; `.git` left out, as the tools leave it out),
    each with the highest line a reference to it may name (the host's count, at least 1);
    None when there is no checkout or more than `limit` files."""
    if checkout is None:
        return None
    root = checkout.resolve()
    found: dict[str, int] = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        for name in names:
            path = Path(folder) / name
            try:
                target = path.resolve()
                if not (target.is_relative_to(root) and target.is_file()):
                    continue
                lines = max(line_count(read_checkout_text(target)), 1)
            except (OSError, ValueError):
                continue
            rel = path.relative_to(root).as_posix()
            if UNDECODABLE.search(rel):  # not UTF-8: no answer could name it (cited as `other`)
                continue
            found[rel] = lines
            if len(found) > limit:
                return None
    return dict(sorted(found.items()))


def _text(dialect: str, *, nonblank: bool, limit: int = TEXT_MAX) -> dict[str, Any]:
    if dialect == "openai":
        # OpenAI's strict mode takes `pattern` (searched, unanchored: "has a non-space",
        # which is the host's rule), not `maxLength`.
        return {"type": "string", "pattern": r"\S"} if nonblank else {"type": "string"}
    # llama.cpp's grammar compiler needs anchored patterns, so an all-blank string is left
    # to the host validator. Its plain strings admit raw control characters (which the
    # host reads, `parse_answer`); the pattern excludes them, and quotes and escapes, so
    # every answer is strict JSON.
    if LLAMA_STRINGS == "pattern":
        return {"type": "string", "pattern": f'^[^"\\\\\\x00-\\x1f]{{{int(nonblank)},{limit}}}$'}
    return {"type": "string", "minLength": 1 if nonblank else 0, "maxLength": limit}


def _line(dialect: str, lines: int) -> dict[str, Any]:
    if dialect == "openai":
        return {"type": "integer", "minimum": 1, "maximum": lines}
    if lines <= LINE_ENUM_MAX:
        return {"type": "integer", "enum": list(range(1, lines + 1))}
    return {"type": "integer", "minimum": 1}


def _file_items(dialect: str, files: Mapping[str, int] | None) -> list[dict[str, Any]]:
    """One item schema per line count: a file's reference can name only its own lines."""

    def item(path: dict[str, Any], line: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"kind": {"type": "string", "enum": ["file"]}, "path": path, "line": line},
            "required": ["kind", "path", "line"],
            "additionalProperties": False,
        }

    if files is None:
        return [item(_text(dialect, nonblank=True), {"type": "integer", "minimum": 1})]
    by_lines: dict[int, list[str]] = {}
    for path, lines in files.items():
        by_lines.setdefault(lines, []).append(path)
    groups = sorted(by_lines.items())
    if dialect == "llama_cpp":
        # Each group's enum holds its lines: past LINE_ENUM_TOTAL entries in all, the
        # longer files share one group whose line the host checks (the grammar, sent with
        # every request, stays small).
        kept, entries = [], 0
        for n, paths in groups:
            if n > LINE_ENUM_MAX or entries + n > LINE_ENUM_TOTAL:
                break
            kept.append((n, paths))
            entries += n
        rest = [path for _n, paths in groups[len(kept) :] for path in paths]
        return [
            *(item({"type": "string", "enum": paths}, _line(dialect, n)) for n, paths in kept),
            *([item({"type": "string", "enum": rest}, {"type": "integer", "minimum": 1})] if rest else []),
        ]
    return [item({"type": "string", "enum": paths}, _line(dialect, n)) for n, paths in groups]


def _evidence(dialect: str, files: Mapping[str, int] | None) -> dict[str, Any]:
    other_item = {
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": list(OTHER_KINDS)},
            "text": _text(dialect, nonblank=True),
        },
        "required": ["kind", "text"],
        "additionalProperties": False,
    }
    items = [*_file_items(dialect, files), other_item]  # no file to cite: no file evidence
    return {"type": "array", "minItems": 1, "maxItems": EVIDENCE_MAX, "items": {"anyOf": items}}


def _assertion(dialect: str, files: Mapping[str, int] | None) -> dict[str, Any]:
    def branch(outcomes: list[str], explained: bool) -> dict[str, Any]:
        text = _text(dialect, nonblank=explained)
        return {
            "type": "object",
            "properties": {
                "verdict": {"type": "string", "enum": outcomes},
                "message": text,
                "expected": text,
                "actual": text,
                "evidence": {"$ref": "#/$defs/evidence"},
            },
            "required": ["verdict", "message", "expected", "actual", "evidence"],
            "additionalProperties": False,
        }

    # A fail must explain itself; a pass or a blocked may leave expected/actual empty.
    return {"anyOf": [branch(["pass", "blocked"], False), branch(["fail"], True)]}


def build_verdict_schema(*, keys: Sequence[str], files: Mapping[str, int] | None, dialect: str) -> dict[str, Any]:
    """The JSON schema of exactly this run's verdict (see the module docstring); `files`
    maps each file evidence may name to its line count (None: any path, `{}`: none)."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown schema dialect {dialect!r}")
    return {
        "type": "object",
        "properties": {
            "summary": _text(dialect, nonblank=False, limit=SUMMARY_MAX),
            "assertions": {
                "type": "object",
                "properties": {key: {"$ref": "#/$defs/assertion"} for key in keys},
                "required": list(keys),
                "additionalProperties": False,
            },
        },
        "required": ["summary", "assertions"],
        "additionalProperties": False,
        "$defs": {"assertion": _assertion(dialect, files), "evidence": _evidence(dialect, files)},
    }


def response_format(schema: dict[str, Any], *, schema_format: str) -> dict[str, Any]:
    """The `response_format` of a chat-completions request, in the form the server takes."""
    if schema_format == "llama_cpp":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "schema": schema, "strict": True}}


class Pairs(dict):
    """A JSON object that named a key twice: `pairs` keeps every member, so that an
    assertion judged twice reaches the host twice (and is refused), not once."""

    def __init__(self, pairs: list[tuple[str, Any]]):
        super().__init__(pairs)
        self.pairs = pairs


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return Pairs(pairs) if len({k for k, _ in pairs}) < len(pairs) else dict(pairs)


def parse_answer(text: str) -> tuple[Any, str]:
    """(document, how it was read). Strict JSON first; then JSON whose strings hold raw
    control characters (a newline typed inside a message), which some grammar-constrained
    servers let through (recorded as `json-lenient`); else the text itself, which the
    host's schema check refuses like any document that is not a JSON object."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[-1].rsplit("```", 1)[0].strip()
    for strict, label in ((True, "json"), (False, "json-lenient")):
        try:
            return json.loads(body, strict=strict, object_pairs_hook=_object), label
        except ValueError:
            continue
    return text, "text"


def derived_status(verdicts: Sequence[Any]) -> str:
    """The overall status from the per-assertion verdicts (the host's rule, `overall_status`);
    anything but pass/fail/blocked counts as blocked (the schema check refuses it anyway)."""
    if not verdicts:
        return "blocked"
    if any(v not in ("pass", "fail") for v in verdicts):
        return "blocked"
    return "fail" if "fail" in verdicts else "pass"


def _evidence_item(item: Any) -> Any:
    if isinstance(item, dict) and item.get("kind") == "file" and "text" not in item and "path" in item:
        path, line = item.get("path"), item.get("line")
        if isinstance(path, str) and (line is None or (isinstance(line, int) and not isinstance(line, bool))):
            rest = {k: v for k, v in item.items() if k not in ("kind", "path", "line")}
            return {"kind": "file", "text": file_ref(path, line), **rest}  # extra keys stay: the host refuses them
    return item


def to_contract(answer: Any, *, keys: Sequence[str]) -> Any:
    """The keyed answer in the contract's list form: one item per key the answer holds
    (the frozen keys first, in their order, then any other key, so the host names it),
    file evidence as `path:line` text, the overall status derived. Anything that is not a
    keyed answer is returned unchanged, for the host's schema check to refuse."""
    if not isinstance(answer, dict) or not isinstance(answer.get("assertions"), dict):
        return answer
    keyed = answer["assertions"]
    pairs = keyed.pairs if isinstance(keyed, Pairs) else list(keyed.items())
    rank = {k: i for i, k in enumerate(keys)}
    pairs = sorted(pairs, key=lambda pair: rank.get(pair[0], len(rank)))  # stable: unknown keys keep their order
    items = []
    for key, item in pairs:
        if isinstance(item, dict):
            evidence = item.get("evidence")
            if isinstance(evidence, list):
                item = {**item, "evidence": [_evidence_item(e) for e in evidence]}
            inner = item.get("key", key)
            # The position names the key; a different key inside the item is kept apart, as
            # a field the contract does not have, so that the host refuses it by name.
            fields = {k: v for k, v in item.items() if k != "key"}
            items.append({"key": key, **fields} if inner == key else {"key": key, **fields, "inner_key": inner})
        else:
            items.append({"key": key, "verdict": item})
    rest = {k: v for k, v in dict(answer).items() if k != "assertions"}
    status = derived_status([i.get("verdict") for i in items])
    return {**rest, "status": status, "assertions": items}
