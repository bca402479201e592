"""Configuration values read from the environment. A plain module (only Django's
`ImproperlyConfigured`): `fusion_site.settings` imports it before Django is configured.

Every variable is documented in docs/CONFIGURATION.md.
"""

from __future__ import annotations

import json
import os
from typing import Any

from django.core.exceptions import ImproperlyConfigured


def json_object(
    name: str, raw: Any, default: dict[str, Any] | None = None, *, of: str, error: type[Exception] = ValueError
) -> dict[str, Any]:
    """`raw` (the value of the variable or setting `name`: a JSON string, or an already
    decoded value) as a dict; `default` (an empty dict unless given) when it is unset or
    blank. Invalid JSON, or JSON that is not an object, raises `error` with a message
    naming `name`: "<name> is not valid JSON: …", "<name> must be a JSON object of <of>"."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {} if default is None else default
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise error(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise error(f"{name} must be a JSON object of {of}")
    return raw


def json_object_from_env(
    name: str, default: dict[str, Any] | None = None, *, of: str, error: type[Exception] = ValueError
) -> dict[str, Any]:
    """The environment variable `name` as a JSON object (see `json_object`)."""
    return json_object(name, os.environ.get(name), default, of=of, error=error)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc
