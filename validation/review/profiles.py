"""Review profiles: which models review and which one evaluates.

`FUSION_REVIEW_PROFILES` (environment, JSON) or the `FUSION_REVIEW_PROFILES` setting (a
dict or a JSON string) holds `{"<name>": {"candidates": [m1, m2, m3], "evaluator": m,
...options}}`. A model is a pydantic-ai model string (`"openai:gpt-5"`, or `"test:<name>"`
for a model registered by tests) or `{"base_url", "model", "api_key_env"}` for an
OpenAI-compatible server; the key is read from the named variable, never stored.
The profile `default` is used when none is named; with one profile, that one.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from fusion_site.runtime.env import json_object
from missions.errors import DomainError, Invalid

DEFAULT_NAME = "default"
OPTIONS: dict[str, tuple[int, int, int]] = {
    # name: (default, minimum, maximum)
    "timeout": (600, 1, 3600),  # seconds per model call (a candidate's whole agent run)
    "max_output_bytes": (48 * 1024, 1024, 1024 * 1024),  # a candidate answer larger than this is unusable
    "request_limit": (40, 1, 500),  # model requests per candidate run (tool rounds)
}
MODEL_KEYS = frozenset({"base_url", "model", "api_key_env"})


class ReviewProfileError(DomainError):
    """The service is not configured for reviews (not the caller's fault)."""

    status = 503
    code = "review_profile_unavailable"


class UnknownReviewProfile(Invalid):
    code = "unknown_review_profile"


def _raw_profiles() -> dict[str, Any]:
    return json_object(
        "FUSION_REVIEW_PROFILES",
        getattr(settings, "FUSION_REVIEW_PROFILES", None),
        of="review profiles",
        error=ReviewProfileError,
    )


def model_problems(where: str, spec: Any) -> list[str]:
    if isinstance(spec, str):
        return [] if spec.strip() else [f"{where}: a model string must not be blank"]
    if not isinstance(spec, dict):
        return [f"{where}: a model is a pydantic-ai model string or {{base_url, model, api_key_env}}"]
    problems = [f"{where}: unknown key {key!r}" for key in sorted(set(spec) - MODEL_KEYS)]
    if "api_key" in spec:
        problems = [f"{where}: never put the key in the profile; name its variable in 'api_key_env'"]
    for key in ("base_url", "model"):
        if not isinstance(spec.get(key), str) or not spec[key].strip():
            problems.append(f"{where}: {key!r} is required")
    if "api_key_env" in spec and not isinstance(spec["api_key_env"], str):
        problems.append(f"{where}: 'api_key_env' must be the name of an environment variable")
    return problems


def profile_problems(name: str, profile: Any) -> list[str]:
    where = f"review profile {name!r}"
    if not isinstance(profile, dict):
        return [f"{where}: must be an object with candidates and evaluator"]
    problems = [
        f"{where}: unknown option {key!r}" for key in sorted(set(profile) - {"candidates", "evaluator", *OPTIONS})
    ]
    candidates = profile.get("candidates")
    if not isinstance(candidates, list) or len(candidates) != 3:
        problems.append(f"{where}: 'candidates' must name exactly 3 models")
    else:
        for i, spec in enumerate(candidates):
            problems += model_problems(f"{where} candidates[{i}]", spec)
    if "evaluator" not in profile:
        problems.append(f"{where}: 'evaluator' is required")
    else:
        problems += model_problems(f"{where} evaluator", profile["evaluator"])
    for option, (_default, minimum, maximum) in OPTIONS.items():
        value = profile.get(option)
        if option in profile and (
            not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum
        ):
            problems.append(f"{where}: {option!r} must be an integer from {minimum} to {maximum}")
    return problems


def resolve_profile(name: str | None = None) -> dict[str, Any]:
    """The named (or default) profile with its options filled in; raise when unusable."""
    profiles = _raw_profiles()
    if not profiles:
        raise ReviewProfileError("no review profile is configured (set FUSION_REVIEW_PROFILES)")
    if not name:
        name = DEFAULT_NAME if DEFAULT_NAME in profiles or len(profiles) != 1 else next(iter(profiles))
    if name not in profiles:
        raise UnknownReviewProfile(
            f"unknown review profile {name!r} (known: {', '.join(sorted(profiles))})", fields={"profile": ["unknown"]}
        )
    problems = profile_problems(name, profiles[name])
    if problems:
        raise ReviewProfileError("; ".join(problems))
    profile = dict(profiles[name])
    for option, (default, _minimum, _maximum) in OPTIONS.items():
        profile.setdefault(option, default)
    return {"name": name, **profile}


def public_model(spec: Any) -> Any:
    """A model spec as it may be shown and stored (it never holds a key)."""
    return spec if isinstance(spec, str) else {k: spec[k] for k in sorted(spec) if k in MODEL_KEYS}
