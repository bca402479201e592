"""Validator profiles: built-ins merged with FUSION_VALIDATORS.

A profile is `{"kind": "checks"|"agent"|"command"|"composite", ...options}`. Problems are
reported by `manage.py check` and, at run time, as a run `error` with the message — never
as a crash inside a worker.
"""

from __future__ import annotations

import copy
from typing import Any

from django.conf import settings

KINDS = ("checks", "agent", "command", "composite")
BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    "checks": {"kind": "checks"},
    "composite": {"kind": "composite"},
}
DEFAULT_PROFILE = "composite"


class ProfileError(Exception):
    """The named profile is missing or misconfigured."""


def all_profiles() -> dict[str, dict[str, Any]]:
    profiles = copy.deepcopy(BUILTIN_PROFILES)
    for name, options in (getattr(settings, "FUSION_VALIDATORS", None) or {}).items():
        profiles[str(name)] = copy.deepcopy(options) if isinstance(options, dict) else {"kind": None, "_raw": options}
    return profiles


def profile_problems(name: str, profile: dict[str, Any]) -> list[str]:
    kind = profile.get("kind")
    if kind not in KINDS:
        return [f"validator profile {name!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}"]
    problems: list[str] = []
    if kind == "agent":
        if not profile.get("model"):
            problems.append(f"validator profile {name!r}: an agent profile needs 'model'")
        if "api_key" in profile:
            problems.append(f"validator profile {name!r}: never put the key in the profile; name its variable in 'api_key_env'")
        if profile.get("output_mode", "tool") not in ("tool", "native", "prompted"):
            problems.append(f"validator profile {name!r}: output_mode must be tool, native or prompted")
    if kind == "command" and not profile.get("command"):
        problems.append(f"validator profile {name!r}: a command profile needs 'command'")
    if kind == "composite" and profile.get("agent") and profile["agent"] not in all_profiles():
        problems.append(f"validator profile {name!r}: unknown agent profile {profile['agent']!r}")
    for field in ("max_repairs", "timeout", "token_budget"):
        if field in profile and (not isinstance(profile[field], int) or profile[field] < 0):
            problems.append(f"validator profile {name!r}: {field} must be a non-negative integer")
    return problems


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
    """What is snapshotted on a run and hashed into the fingerprint (no secrets)."""
    return {k: v for k, v in profile.items() if k not in ("api_key",)}
