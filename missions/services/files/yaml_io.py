"""The mission file as text: a YAML (and so JSON) reader that refuses duplicate keys, and
the writer of exports. The command line and `POST /api/missions/import/` hand it the text
as sent, so both report the same `document: …` line for a text that cannot be read."""

from __future__ import annotations

import json
from typing import Any

import yaml

MAX_DOCUMENT_CHARS = 5_000_000


def load(document: str | bytes | dict, errors: list[str]) -> Any:
    """The document as data (a mapping passes through); a problem is appended to `errors`."""
    if isinstance(document, dict):
        return document
    if isinstance(document, bytes):
        document = document.decode("utf-8", errors="replace")
    if not isinstance(document, str):
        errors.append("document: must be YAML text or a mapping")
        return None
    if len(document) > MAX_DOCUMENT_CHARS:
        errors.append(f"document: too large (at most {MAX_DOCUMENT_CHARS} characters)")
        return None
    if document.lstrip().startswith("{"):
        # JSON is read as JSON: PyYAML (YAML 1.1) refuses some of it (a tab indenting a line)
        # and reads some other (a surrogate pair `\ud83d\ude00` as two lone halves).
        try:
            return json.loads(document, object_pairs_hook=_unique_pairs)
        except ValueError:
            pass  # not JSON: a YAML flow mapping, or a mistake YAML's reader places
        except RecursionError:
            errors.append(_TOO_DEEP)
            return None
    try:
        return yaml.load(document, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        errors.append(f"document: invalid YAML: {problem}{where}")
        return None
    except RecursionError:
        errors.append(_TOO_DEEP)
        return None


_TOO_DEEP = "document: nested too deeply"


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object; a duplicate key makes it no JSON, so that YAML's reader says where."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def dump(document: dict[str, Any]) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False)


class KeyList(list):
    """A list of keys, written inline (`assertions: [VAL-1, VAL-2]`) as in docs/MISSION_FILES.md."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)):
            continue
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_keys(dumper: _Dumper, value: KeyList) -> yaml.SequenceNode:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=True)


def _represent_str(dumper: _Dumper, value: str) -> yaml.ScalarNode:
    # Multi-line text reads best as a literal block; the emitter falls back to a quoted
    # style by itself when the text cannot be a block (trailing spaces, tabs...).
    # Other line breaks (NEL, LS, PS, CR) are normalized to "\n" by a reader of a block
    # or a quoted line fold: only the double-quoted style keeps them, as escapes.
    style: str | None
    if any(c in value for c in _OTHER_BREAKS):
        style = '"'
    else:
        style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_OTHER_BREAKS = ("\r", "\x85", "\u2028", "\u2029")


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(KeyList, _represent_keys)
