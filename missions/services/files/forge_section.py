"""The mission file's `forge:` section (docs/FORGES.md): the repository the mission
follows on a forge. The plan only declares and reads it; the `forges` app, a floor above,
writes it (it receives `missions.hooks.mission_file_imported` in the import's
transaction, and judges the token's credentials there, where the stored forge is known).

The limits repeat the `forges.Forge` columns (this floor cannot import that model);
`tests/forges/test_mission_file.py` checks that they agree.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from missions.services.files.fields import EnvName, Text, _Rule

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


class MissionFileForge(BaseModel):
    """The repository the mission follows on a forge: webhooks in complete its tasks,
    statuses and a pull-request comment go out. The webhook's secret is never in the file
    (`GET /api/missions/{id}/forge/` shows it to the owner and staff)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    provider: Annotated[str, Text(16, True, PROVIDERS)] = Field(description="github, gitlab, gitea or generic.")
    api_url: Annotated[str, Text(500, False), HttpUrl()] = Field(
        default="", description="The forge's API root (https://api.github.com, https://gitlab.example.com/api/v4)."
    )
    repository: Annotated[str, Text(300, False)] = Field(
        default="", description="owner/name (GitHub, Gitea); the project's path or id (GitLab)."
    )
    token_env: Annotated[str, Text(100, False), EnvName()] = Field(
        default="", description="The workers' variable holding the API token (FUSION_GIT_CREDENTIALS binds it)."
    )
    feature_pattern: Annotated[str, Text(200, False), Regex()] = Field(
        default=DEFAULT_FEATURE_PATTERN,
        description="Finds a feature key in a pull request's branch or title: its first group, or the whole match.",
    )
    statuses: bool = Field(default=True, description="Post a commit status for each judged revision.")
    comments: bool = Field(default=True, description="Keep one comment on a pull request up to date.")
    context: Annotated[str, Text(100, True)] = Field(
        default=DEFAULT_CONTEXT, description="The commit status's context (GitHub, Gitea) or name (GitLab)."
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_omitted(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (v is None and k in cls.model_fields)}
        return data


FORGE_FIELDS = tuple(MissionFileForge.model_fields)
