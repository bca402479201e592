"""The rules of the mission file's `forge:` section (declared in `schema.MissionFileForge`;
docs/FORGES.md): the repository the mission follows on a forge. The plan only declares
and reads it; the `forges` app, a floor above, writes it (it receives
`missions.hooks.mission_file_imported` in the import's transaction, and judges the
token's credentials there, where the stored forge is known).

The limits and defaults repeat the `forges.Forge` columns (this floor cannot import that
model); `tests/forges/test_forge_config.py` checks that they agree.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic_core import PydanticCustomError

from missions.services.files.fields import _Rule

PROVIDERS = ("github", "gitlab", "gitea", "generic")
DEFAULT_FEATURE_PATTERN = r"\[([A-Za-z0-9][\w.-]*)\]"
DEFAULT_CONTEXT = "fusion-missions"


class Regex(_Rule):
    """A regular expression (Python's syntax), matched case-insensitively."""

    def check(self, value: str) -> str:
        try:
            re.compile(value, re.IGNORECASE)
        except re.error as exc:
            raise PydanticCustomError(
                "mission_file", "must be a regular expression: {error}", {"error": str(exc)}
            ) from exc
        return value

    def json(self) -> dict[str, Any]:
        return {"format": "regex"}


class HttpUrl(_Rule):
    def check(self, value: str) -> str:
        if value and not re.match(r"https?://[^/\s]+", value):
            raise PydanticCustomError("mission_file", "must be an http(s) URL")
        return value
