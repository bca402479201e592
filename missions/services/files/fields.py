"""The rules of one value of a mission file, and `column`: the file field of a model
column, whose rule, default and limits come from the Django model field (so the file
follows the database schema). Each rule raises the file's own messages and adds its
limits to the JSON schema; `schema` declares the file's models with them.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Annotated, Any

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from pydantic import (
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
)
from pydantic_core import PydanticCustomError, core_schema

from fusion_site.repos.sources import SourceRefused, check_credentials_env
from missions.checks_spec import MAX_PATTERN_CHARS, MAX_PATTERNS, check_spec_problems, pattern_problems
from missions.environment_spec import MAX_PATH, MAX_SETUP, PRESETS, environment_problems
from missions.models import Mission
from missions.services.verdict_settings import MAX_ALLOWED_VALIDATORS, allowed_validators_problems

_SLUG = re.compile(r"^[-a-zA-Z0-9_]+\Z")

# Error types of a value that is read all the same by the rules of the whole file (a list
# with a bad pattern still needs a base_revision); any other refused value reads as its default.
PROBLEM_LISTS = "check_problems", "pattern_problems", "environment_problems"


def plain(value: Any) -> Any:
    """A choices enum (a model default not yet reloaded) written as its plain value."""
    return value.value if isinstance(value, enum.Enum) else value


def _problem(message: str) -> PydanticCustomError:
    return PydanticCustomError("mission_file", message)


def _problems(kind: str, suffixes: list[str]) -> PydanticCustomError:
    """Several problems of one value, each a suffix of its path (`: …` or `[2]: …`)."""
    return PydanticCustomError(kind, "{suffixes}", {"suffixes": suffixes})


class _Rule:
    """A field's own rules, run after pydantic's type check; `json` adds their limits to the schema."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(self.validate, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> Any:
        return {**handler(schema), **self.json()}

    def validate(self, value: Any, handler: core_schema.ValidatorFunctionWrapHandler) -> Any:
        return self.check(handler(value))

    def check(self, value: Any) -> Any:
        return value

    def json(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class Text(_Rule):
    """A string column: NUL, choices, blank, slug, length, in this order (the first problem is told)."""

    max_length: int | None
    nonblank: bool
    choices: tuple[str, ...] = ()
    slug: bool = False

    def check(self, value: str) -> str:
        if "\x00" in value:
            raise _problem("must not contain NUL characters")
        if self.choices and value not in self.choices:
            raise _problem(f"must be one of {', '.join(self.choices)}")
        if self.nonblank and not value.strip():
            raise _problem("must not be blank")
        if self.slug and not _SLUG.match(value):
            raise _problem("must be a slug (letters, digits, hyphens and underscores)")
        if self.max_length is not None and len(value) > self.max_length:
            raise _problem(f"must be at most {self.max_length} characters")
        return value

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"enum": list(self.choices)} if self.choices else {}
        if self.slug:
            out["pattern"] = "^[-a-zA-Z0-9_]+$"
        elif self.nonblank and not self.choices:
            out["pattern"] = r"\S"
        if self.max_length is not None and not self.choices:
            out["maxLength"] = self.max_length
        return out


@dataclass(frozen=True)
class Integer(_Rule):
    minimum: int | None
    maximum: int | None

    def check(self, value: int) -> int:
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            raise _problem(f"must be between {self.minimum} and {self.maximum}")
        return value

    def json(self) -> dict[str, Any]:
        limits = {"minimum": self.minimum, "maximum": self.maximum}
        return {name: limit for name, limit in limits.items() if limit is not None}


class _Reworded(_Rule):
    """A value of the wrong type reads as `wrong_type` (the field's own wording)."""

    wrong_type = ""

    def validate(self, value: Any, handler: core_schema.ValidatorFunctionWrapHandler) -> Any:
        try:
            value = handler(value)
        except ValidationError as exc:  # the type check
            raise _problem(self.wrong_type) from exc
        return self.check(value)


class Check(_Reworded):
    """An assertion's deterministic check: `missions.checks_spec` decides its shape."""

    wrong_type = "must be a mapping (a check: see docs/MISSION_FILES.md) or null"

    def check(self, value: dict | None) -> dict | None:
        if value is None:
            return None
        suffixes = [f": {p}" for p in check_spec_problems(value)]
        if any(isinstance(v, str) and "\x00" in v for v in value.values()):
            suffixes.append(": must not contain NUL characters")
        if suffixes:
            raise _problems("check_problems", suffixes)
        return value

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> Any:
        # null, like any omitted field, means none: written as an object only (OpenAPI 3.0 has no null type)
        return {"type": "object", "additionalProperties": True}


class Environment(_Reworded):
    """A declared environment: `missions.environment_spec` decides its shape."""

    wrong_type = "must be a mapping (preset, setup, key_files, path: see docs/ENVIRONMENTS.md)"

    def check(self, value: dict | None) -> dict | None:
        if value is None:
            return None
        if problems := environment_problems(value):
            # `setup[1]: …` names a place inside the mapping; `must …` is the mapping's own
            suffixes = [f": {p}" if p.startswith("must ") else f".{p}" for p in problems]
            raise _problems("environment_problems", suffixes)
        return value

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> Any:
        # null (a milestone's: the mission's) is written as an omitted field, as for a check
        strings = {"type": "array", "items": {"type": "string", "minLength": 1}}
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "preset": {"enum": list(PRESETS), "default": "none"},
                "setup": {**strings, "maxItems": MAX_SETUP},
                "key_files": {**strings, "maxItems": MAX_PATTERNS},
                "path": {**strings, "maxItems": MAX_PATH},
            },
        }


@dataclass(frozen=True)
class EnvName(_Rule):
    """The name of an environment variable, or '' (`fusion_site.repos.sources.check_credentials_env`)."""

    def check(self, value: str) -> str:
        try:
            return check_credentials_env(value)
        except SourceRefused as exc:
            raise _problem(str(exc)) from exc

    def json(self) -> dict[str, Any]:
        return {"pattern": r"^\s*([A-Za-z_][A-Za-z0-9_]*)?\s*$"}


class Patterns(_Reworded):
    """Glob patterns relative to the repository (`missions.checks_spec.pattern_problems`)."""

    wrong_type = "must be a list of glob patterns"

    def check(self, value: list) -> list:
        if suffixes := pattern_problems(value, ""):
            raise _problems("pattern_problems", suffixes)
        return value

    def json(self) -> dict[str, Any]:
        return {
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_PATTERN_CHARS},
            "maxItems": MAX_PATTERNS,
        }


class ProfileNames(_Reworded):
    """Validator profile names (`missions.services.verdict_settings.allowed_validators_problems`)."""

    wrong_type = "must be a list of validator profile names"

    def check(self, value: list) -> list:
        if problems := allowed_validators_problems(value):
            raise _problem("; ".join(problems))
        return value

    def json(self) -> dict[str, Any]:
        limit = Mission._meta.get_field("validator").max_length
        return {"items": {"type": "string", "minLength": 1, "maxLength": limit}, "maxItems": MAX_ALLOWED_VALIDATORS}


class _KeyRule(_Reworded):
    wrong_type = "must be a key (a non-empty string)"

    def check(self, value: str) -> str:
        if not value:
            raise _problem(self.wrong_type)
        return value

    def json(self) -> dict[str, Any]:
        return {"minLength": 1}


# A reference to another entity of the file by its key.
Key = Annotated[str, _KeyRule()]


@dataclass(frozen=True)
class Column:
    """Marks a field as a model column; the reader keeps its value under `attname`."""

    attname: str


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def column(model: type[models.Model], name: str, *more: _Rule) -> Any:
    """The file field of a model column: its rule, default and limits come from the model,
    so the file follows the database schema; `more` rules run after the column's."""
    f = model._meta.get_field("check_spec" if name == "check" else name)
    assert isinstance(f, models.Field), f"{model.__name__}.{name} is not a column"
    rule: _Rule | None
    if isinstance(f, models.JSONField):
        rules = {"check": Check, "allowed_validators": ProfileNames, "environment": Environment}
        rule = rules.get(name, Patterns)()
    elif isinstance(f, models.BooleanField):
        rule = None
    elif isinstance(f, models.IntegerField):
        maxima = [v.limit_value for v in f.validators if isinstance(v, MaxValueValidator)]
        minima = [v.limit_value for v in f.validators if isinstance(v, MinValueValidator)]
        rule = Integer(minimum=max(minima) if minima else None, maximum=min(maxima) if maxima else None)
    else:
        choices = tuple(str(c) for c, _ in f.choices or ())
        rule = Text(f.max_length, not f.blank, choices, slug=isinstance(f, models.SlugField) and not choices)
    required = not f.has_default() and not f.blank and not f.null
    description = str(f.help_text) or None
    if required:
        info = Field(description=description)
    elif isinstance(f.get_default(), list | dict):
        info = Field(default_factory=type(f.get_default()), description=description)  # never one shared value
    elif f.get_default() is None:
        info = Field(default=None, description=description, json_schema_extra=_no_default)
    else:
        info = Field(default=plain(f.get_default()), description=description)
    info.metadata += [Column(f.attname), *([rule] if rule else []), *more]
    return info


def _deprecated(schema: dict[str, Any]) -> None:
    schema.pop("default", None)
    schema["deprecated"] = True


def former_name(model: type[models.Model], name: str) -> Any:
    """The former name of a text column, read (never written) as an alias of `name`: not a
    column itself, `validating` reads it into the column (`MISSION_FORMER_NAMES`)."""
    f = model._meta.get_field(name)
    assert isinstance(f, models.CharField), f"{model.__name__}.{name} is not a text column"
    info: Any = Field(  # a FieldInfo (typed as its default)
        default=None,
        description=f"Former name of `{name}`, still read for one release: give `{name}` instead.",
        json_schema_extra=_deprecated,
    )
    info.metadata += [Text(f.max_length, nonblank=False)]
    return info
