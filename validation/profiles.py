"""Validator profiles: built-ins merged with FUSION_VALIDATORS.

A profile is `{"kind": "checks"|"agent"|"command"|"composite", ...options}`. Problems are
reported by `manage.py check` and, at run time, as a run `error` with the message — never
as a crash inside a worker. Unknown options are problems too: a misspelt `max_repair`
silently ignored would leave the default in force without anyone knowing.
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any
from urllib.parse import urlparse

from django.conf import settings

from validation import verdict_schema
from validation.verdict_schema import DIALECTS, SCHEMA_VERSION

KINDS = ("checks", "agent", "command", "composite")
BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    "checks": {"kind": "checks"},
    "composite": {"kind": "composite"},
}
DEFAULT_PROFILE = "composite"
OUTPUT_MODES = ("tool", "native", "prompted", "schema")
JOURNAL_POLICIES = ("transcript", "hash-only")
AGENT_TOOLS = ("read", "grep", "find", "ls", "run_check")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
COMMON = {"kind", "name", "description"}
OPTIONS = {
    "checks": COMMON,
    "composite": COMMON | {"agent"},
    "agent": COMMON
    | {
        "model",
        "base_url",
        "api_key_env",
        "temperature",
        "max_repairs",
        "timeout",
        "token_budget",
        "output_mode",
        "journal_policy",
        "tools",
        "tool_choice",
        "native_format",
        "schema_format",
        "max_tokens",
        "max_tokens_field",
        "max_requests",
    },
    "command": COMMON | {"command", "shell", "timeout", "max_repairs", "journal_policy", "api_key_env", "network"},
}
CHOICES = {
    "output_mode": OUTPUT_MODES,
    "journal_policy": JOURNAL_POLICIES,
    "tool_choice": ("required", "auto", "output"),
    "native_format": ("json_schema", "json_object"),
    "schema_format": DIALECTS,  # the forms of response_format the schema mode can send
    "max_tokens_field": ("max_tokens", "max_completion_tokens"),  # how max_tokens reaches a base_url server
}
INTEGERS = {
    "max_repairs": (0, 10),
    "timeout": (1, 86_400),
    "token_budget": (0, None),
    "max_tokens": (1, None),
    "max_requests": (1, 1000),
}


class ProfileError(Exception):
    """The named profile is missing or misconfigured."""


def all_profiles() -> dict[str, dict[str, Any]]:
    profiles = copy.deepcopy(BUILTIN_PROFILES)
    for name, options in (getattr(settings, "FUSION_VALIDATORS", None) or {}).items():
        profiles[str(name)] = copy.deepcopy(options) if isinstance(options, dict) else {"kind": None, "_raw": options}
    return profiles


def _integer_problems(profile: dict[str, Any]) -> list[str]:
    problems = []
    for name, (low, high) in INTEGERS.items():
        if name not in profile:
            continue
        value = profile[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            problems.append(f"{name} must be an integer {bound}")
    return problems


def _common_problems(profile: dict[str, Any]) -> list[str]:
    problems = [f"unknown option {k!r}" for k in sorted(set(profile) - OPTIONS[profile["kind"]]) if k != "api_key"]
    for name, allowed in CHOICES.items():
        if name in profile and profile[name] not in allowed:
            problems.append(f"{name} must be one of {', '.join(allowed)}")
    problems += _integer_problems(profile)
    env = profile.get("api_key_env")
    if env is not None and (not isinstance(env, str) or not ENV_NAME.match(env)):
        problems.append("api_key_env must be the NAME of an environment variable")
    if "api_key" in profile:
        problems.append("never put the key in the profile; name its variable in 'api_key_env'")
    return problems


def _agent_problems(profile: dict[str, Any]) -> list[str]:
    problems = []
    if not isinstance(profile.get("model"), str) or not profile["model"].strip():
        problems.append(
            "an agent profile needs 'model' (a pydantic-ai model name, or the server's model with base_url)"
        )
    base_url = profile.get("base_url")
    if base_url is not None:
        parsed = urlparse(base_url) if isinstance(base_url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
            problems.append("base_url must be an http(s) URL of an OpenAI-compatible server")
    temperature = profile.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2
    ):
        problems.append("temperature must be a number between 0 and 2")
    tools = profile.get("tools")
    if tools is not None and (not isinstance(tools, list) or not set(tools) <= set(AGENT_TOOLS)):
        problems.append(f"tools must be a list drawn from {', '.join(AGENT_TOOLS)}")
    if profile.get("tool_choice") == "output" and profile.get("output_mode", "tool") != "tool":
        problems.append("tool_choice 'output' needs output_mode 'tool'")
    if "schema_format" in profile and profile.get("output_mode", "tool") != "schema":
        problems.append("schema_format needs output_mode 'schema'")
    return problems


def _command_problems(profile: dict[str, Any]) -> list[str]:
    command = profile.get("command")
    ok = (isinstance(command, str) and command.strip()) or (
        isinstance(command, list) and command and all(isinstance(c, str) for c in command)
    )
    problems = [] if ok else ["a command profile needs 'command' (a string or a list of arguments)"]
    if "shell" in profile and not isinstance(profile["shell"], bool):
        problems.append("shell must be true or false")
    if "network" in profile and not isinstance(profile["network"], bool):
        problems.append("network must be true or false")
    return problems


def _composite_problems(profile: dict[str, Any], profiles: dict[str, dict[str, Any]]) -> list[str]:
    agent = profile.get("agent")
    if not agent:
        return []
    if agent not in profiles:
        return [f"unknown agent profile {agent!r}"]
    if profiles[agent].get("kind") not in ("agent", "command"):
        return [f"the agent option must name an agent or command profile; {agent!r} is {profiles[agent].get('kind')!r}"]
    return []


def profile_problems(name: str, profile: dict[str, Any]) -> list[str]:
    kind = profile.get("kind")
    if kind not in KINDS:
        return [f"validator profile {name!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}"]
    problems = _common_problems(profile)
    if kind == "agent":
        problems += _agent_problems(profile)
    elif kind == "command":
        problems += _command_problems(profile)
    elif kind == "composite":
        problems += _composite_problems(profile, all_profiles())
    return [f"validator profile {name!r}: {p}" for p in problems]


def profile_warnings(name: str, profile: dict[str, Any]) -> list[str]:
    """Things that may be fine where the workers run but are wrong here."""
    warnings = []
    env = profile.get("api_key_env")
    if isinstance(env, str) and ENV_NAME.match(env) and not os.environ.get(env):
        warnings.append(f"validator profile {name!r}: the environment variable {env} (api_key_env) is not set here")
    limit = settings.FUSION_VALIDATOR_TIMEOUT
    if isinstance(profile.get("timeout"), int) and profile["timeout"] > limit:
        warnings.append(
            f"validator profile {name!r}: timeout {profile['timeout']}s is longer than "
            f"FUSION_VALIDATOR_TIMEOUT ({limit}s); the recovery sweep would reap the run first"
        )
    return warnings


def get_profile(name: str | None) -> dict[str, Any]:
    name = name or DEFAULT_PROFILE
    profiles = all_profiles()
    if name not in profiles:
        raise ProfileError(f"unknown validator profile {name!r} (known: {', '.join(sorted(profiles))})")
    profile = profiles[name]
    problems = profile_problems(name, profile)
    if problems:
        raise ProfileError("; ".join(problems))
    return {"name": name, **profile}


def public_config(profile: dict[str, Any]) -> dict[str, Any]:
    """What is snapshotted on a run and hashed into the fingerprint (no secrets). A
    composite embeds its agent profile's config, so that changing the agent (its model,
    its budget) changes the fingerprint and an old pass is not reused for it."""
    config = _with_implied({k: v for k, v in profile.items() if k not in ("api_key",)})
    agent = profile.get("kind") == "composite" and profile.get("agent")
    if agent and agent in all_profiles():
        config["agent_config"] = _with_implied({k: v for k, v in all_profiles()[agent].items() if k != "api_key"})
    return config


def _with_implied(config: dict[str, Any]) -> dict[str, Any]:
    """An agent's config with what the host implies and the profile does not say, where it
    changes what the model is sent: the field the output limit goes in (a `base_url`
    server that reads another has no limit), and for the schema mode the version of the
    verdict schema (the schema itself follows from the frozen keys and the revision, both
    fingerprinted; its rules from this version) and, under `llama_cpp`, the strings' form.
    A change of any of them is a new fingerprint: an old pass is not reused for it."""
    if config.get("kind") != "agent":
        return config
    implied: dict[str, Any] = {}
    if config.get("base_url"):
        implied["max_tokens_field"] = config.get("max_tokens_field", "max_tokens")
    if config.get("output_mode") == "schema":
        implied["verdict_schema_version"] = SCHEMA_VERSION
        if config.get("schema_format") == "llama_cpp":
            implied["llama_strings"] = verdict_schema.LLAMA_STRINGS
    return {**config, **implied}
