"""The mission file, declared once: pydantic models whose types, defaults and limits come
from the Django model fields (through `fields.column`, whose rules raise the file's own
messages), and the JSON schema (`docs/mission-file.schema.json`, `python manage.py
mission_file_schema`).

The models only judge each value on its own (types, unknown fields, the rules of a text,
a number, a check, a list of patterns); what needs the whole file (duplicate keys,
references, dependency cycles, protection, the repository) is `validating`'s, and whether
the importing user may name that repository is `importing`'s.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice
from missions.services.files.fields import Column, EnvName, Key, Text, column, former_name
from missions.services.files.forge_section import (
    DEFAULT_CONTEXT,
    DEFAULT_FEATURE_PATTERN,
    PROVIDERS,
    HttpUrl,
    Regex,
)


class _Closed(BaseModel):
    """Strict types, unknown fields refused; a null value means the field was omitted."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_is_omitted(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (v is None and k in cls.model_fields)}
        return data


class MissionFileAssertion(_Closed):
    """A contract assertion; `scope: milestone` ones are judged on the milestone, not linked to features."""

    key: str = column(ContractAssertion, "key")
    title: str = column(ContractAssertion, "title")
    statement: str = column(ContractAssertion, "statement")
    scope: str = column(ContractAssertion, "scope")
    check: dict[Any, Any] | None = column(ContractAssertion, "check")


class MissionFileFeature(_Closed):
    key: str = column(MissionFeature, "key")
    title: str = column(MissionFeature, "title")
    description: str = column(MissionFeature, "description")
    acceptance_criteria: str = column(MissionFeature, "acceptance_criteria")
    assertions: list[Key] = Field(default_factory=list, description="Keys of feature-scoped assertions of the file.")


class MissionFileSlice(_Closed):
    key: str = column(Slice, "key")
    title: str = column(Slice, "title")
    description: str = column(Slice, "description")
    features: list[MissionFileFeature] = Field(default_factory=list)


class MissionFileMilestone(_Closed):
    key: str = column(Milestone, "key")
    title: str = column(Milestone, "title")
    description: str = column(Milestone, "description")
    dependencies: list[Key] = Field(default_factory=list, description="Keys of milestones of the file.")
    assertions: list[MissionFileAssertion] = Field(default_factory=list)
    slices: list[MissionFileSlice] = Field(default_factory=list)
    environment: dict[Any, Any] | None = column(Milestone, "environment")


class MissionFileMission(_Closed):
    """The mission. `status` applies to a new mission only; afterwards it changes through the mission's actions."""

    key: str = column(Mission, "key")
    title: str = column(Mission, "title")
    description: str = column(Mission, "description")
    status: str = column(Mission, "status")
    repository: str = column(Mission, "repository")
    workspace: str = former_name(Mission, "repository")
    credentials_env: str = column(Mission, "credentials_env", EnvName())
    branch: str = column(Mission, "branch")
    base_revision: str = column(Mission, "base_revision")
    protected_paths: list[Any] = column(Mission, "protected_paths")
    on_protected_change: str = column(Mission, "on_protected_change")
    protect_runner_config: bool = column(Mission, "protect_runner_config")
    submodules: bool = column(Mission, "submodules")
    validator: str = column(Mission, "validator")
    allowed_validators: list[Any] = column(Mission, "allowed_validators")
    environment: dict[Any, Any] = column(Mission, "environment")
    executor: str = column(Mission, "executor")
    executor_command: str = column(Mission, "executor_command")
    autopilot: bool = column(Mission, "autopilot")
    auto_fix: bool = column(Mission, "auto_fix")
    retry_budget: int = column(Mission, "retry_budget")


class MissionFileForge(_Closed):
    """The repository the mission follows on a forge: webhooks in complete its tasks,
    statuses and a pull-request comment go out. The webhook's secret is never in the file
    (`GET /api/missions/{id}/forge/` shows it to the owner and staff)."""

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


def _object_when_given(schema: dict[str, Any]) -> None:
    """`forge:` omitted or null leaves the stored forge alone; the schema names only the
    object, as OpenAPI 3.0 (which embeds this schema) has no `null` type."""
    for option in schema.pop("anyOf", []):
        if option.get("type") != "null":
            schema.update(option)
    schema.pop("default", None)


class MissionFile(_Closed):
    """A mission file (docs/MISSION_FILES.md): entities are matched by key, order comes
    from list positions, an omitted or null field takes its default."""

    mission: MissionFileMission
    milestones: list[MissionFileMilestone] = Field(default_factory=list)
    forge: MissionFileForge | None = Field(default=None, json_schema_extra=_object_when_given)


@functools.cache
def columns(model: type[BaseModel]) -> dict[str, str]:
    """{file field: model attname} of the entity's columns, in the file's order."""
    return {
        name: meta.attname
        for name, info in model.model_fields.items()
        for meta in info.metadata
        if isinstance(meta, Column)
    }


def fallback(model: type[BaseModel], name: str) -> Any:
    """What a missing or refused value reads as: its default ("" for a required text)."""
    info = model.model_fields[name]
    return "" if info.is_required() else info.get_default(call_default_factory=True)


def text_rule(model: type[BaseModel], name: str) -> Text:
    return next(meta for meta in model.model_fields[name].metadata if isinstance(meta, Text))


MISSION_FIELDS = tuple(columns(MissionFileMission))
# Former names still read (never written): {former name: the column's file field}.
MISSION_FORMER_NAMES = {"workspace": "repository"}
MILESTONE_FIELDS = tuple(columns(MissionFileMilestone))
ASSERTION_FIELDS = tuple(columns(MissionFileAssertion))
SLICE_FIELDS = tuple(columns(MissionFileSlice))
FEATURE_FIELDS = tuple(columns(MissionFileFeature))


def mission_file_json_schema(*, inline: bool = False) -> dict[str, Any]:
    """The JSON schema of a mission file (as read from YAML or JSON). `inline` writes each
    `$defs` entry in place of its references, for a document where `#/$defs/…` would not
    resolve (the OpenAPI schema)."""
    schema = MissionFile.model_json_schema()
    if not inline:
        return schema
    defs = schema.pop("$defs", {})

    def resolved(node: Any) -> Any:
        if isinstance(node, list):
            return [resolved(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:  # `#/$defs/Name`: the models do not nest themselves
            node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
        return {key: resolved(value) for key, value in node.items()}

    return resolved(schema)
