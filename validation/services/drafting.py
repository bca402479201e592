"""A mission file drafted from a specification by the configured model (`manage.py plan
SPEC.md`, docs/MISSION_FILES.md, "Drafting a file"): for a person to review, plan and apply;
nothing here writes to the database.

The model answers in the mission file's own declaration (`missions.services.files.MissionFile`,
the pydantic model behind docs/mission-file.schema.json) as its structured output, the way the
agent validator answers a verdict (`validation/validators/agent.py`: the profile's model and
output mode); the host then judges the whole file as the import would before the database
(duplicate keys, references, cycles), and a file with mistakes goes back to the model with
them, up to the profile's `max_repairs`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent, ModelRetry, NativeOutput, PromptedOutput, ToolOutput
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

from missions.errors import DomainError
from missions.services.files import MissionFile
from missions.services.files.validating import validated
from missions.services.files.yaml_io import dump
from validation.profiles import ProfileError, get_profile
from validation.validators.agent import AgentOptions
from validation.validators.agent_models import resolve_model

SYSTEM = """You turn a software specification into a mission file: the contract an implementing agent works to.
A mission has milestones in order; a milestone has contract assertions and slices; a slice has features.
- Keys are short slugs, unique within the file: milestones m1, m2, ...; slices s1, s2, ...; features
  kebab-case names; assertions VAL-<AREA>-<NNN>.
- An assertion is one observable, testable behaviour: `title` names it, `statement` says exactly what must
  hold. `scope: milestone` for behaviour judged on the whole milestone (not linked to a feature).
- A feature is one unit of work; `assertions` lists the keys of the feature-scoped assertions of its own
  milestone that it fulfils. Every feature-scoped assertion is fulfilled by at least one feature.
- `dependencies` lists keys of earlier milestones a milestone waits for.
- Leave the repository, checks, executor and validator settings out unless the specification names them;
  a person adds them when reviewing.
Answer with the mission file only."""


@dataclass
class Draft:
    text: str  # the mission file as YAML
    data: dict[str, Any]
    profile: str


def agent_profile(name: str | None) -> dict[str, Any]:
    """The profile whose model drafts: an agent profile, or a composite's agent."""
    profile = get_profile(name)
    if profile.get("kind") == "composite" and profile.get("agent"):
        profile = get_profile(profile["agent"])
    if profile.get("kind") != "agent":
        raise ProfileError(
            f"profile {profile['name']!r} has no model: name an agent profile (FUSION_VALIDATORS) with --profile"
        )
    return profile


def _output(mode: str) -> Any:
    if mode == "native":
        return NativeOutput(MissionFile, name="mission_file", description="The mission file")
    if mode in ("prompted", "schema"):
        return PromptedOutput(MissionFile, name="mission_file", description="The mission file")
    return ToolOutput(MissionFile, name="submit_mission_file", description="Submit the complete mission file")


def _document(answer: MissionFile) -> dict[str, Any]:
    return answer.model_dump(exclude_defaults=True, exclude_none=True)


def build_agent(options: AgentOptions) -> Agent[None, MissionFile]:
    settings: ModelSettings = {"timeout": float(options.timeout)}
    if options.temperature is not None:
        settings["temperature"] = float(options.temperature)
    if options.max_tokens:
        settings["max_tokens"] = options.max_tokens
    agent: Agent[None, MissionFile] = Agent(
        resolve_model(options, replay=False),
        output_type=_output(options.output_mode),
        system_prompt=SYSTEM,
        retries={"output": options.max_repairs},
        model_settings=settings,
    )

    @agent.output_validator
    def whole_file(answer: MissionFile) -> MissionFile:
        try:
            errors = validated(_document(answer), None).errors
        except DomainError as exc:
            errors = [str(line) for line in exc.fields.get("errors", [exc.detail])]
        if errors:
            raise ModelRetry("The mission file has mistakes; answer it again, corrected:\n" + "\n".join(errors))
        return answer

    return agent


def mission_draft(*, spec: str, profile: str | None = None) -> Draft:
    """The configured model's mission file for `spec`; raises `ProfileError` for a profile
    that cannot draft, and what the model's client raises."""
    chosen = agent_profile(profile)
    options = AgentOptions.from_profile(chosen)
    agent = build_agent(options)
    limits = UsageLimits(request_limit=options.max_requests)
    result = asyncio.run(asyncio.wait_for(agent.run(spec, usage_limits=limits), timeout=options.timeout))
    data = _document(result.output)
    return Draft(text=dump(data), data=data, profile=chosen["name"])
