"""The review request (seed `fusion_validate`): a closed body, validated and normalized.

Rules, in the order they are applied:
1. the body must be a JSON object;
2. a body with a `prompt` key is the legacy shape: it is refused first, alone, with an
   error that shows the new shape;
3. every other problem is collected (unknown keys, missing keys, wrong types, blank
   strings, empty required arrays, size caps, the verification cross-field rule) and
   reported at once, each under its path (`scope[2]`, `verification.evidence[0].check`).

Normalization trims every string, fills omitted optional arrays with `[]`, and writes
verification as `{status, evidence}` (provided) or `{status, evidence: [], reason}`
(not_run). Keys come out in one fixed order; the canonical form is RFC 8785 anyway.

The body is declared once, as the pydantic models below (`ReviewRequest`): rule 3 is
their validation, its errors translated to the messages of this contract, and
`review_request_json_schema()` is their JSON schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError, core_schema

from missions.errors import Invalid
from validation.journal import canonical, sha256_of

MAX_STRING = 20_000
MAX_ITEMS = 100
MAX_CANONICAL_BYTES = 256 * 1024
MAX_REVISION = 80
# Ids travel in the canonical (RFC 8785) form of the request, whose numbers are IEEE
# doubles: an id past 2**53 could not be represented exactly.
MAX_ID = 2**53 - 1

CORE_KEYS = (
    "objective",
    "background",
    "changeSummary",
    "scope",
    "acceptanceCriteria",
    "verification",
    "knownLimitations",
    "exclusions",
)
REFERENCE_KEYS = ("mission", "feature", "revision")
ALLOWED_KEYS = frozenset(CORE_KEYS + REFERENCE_KEYS)
Status = Literal["provided", "not_run"]
STATUSES: tuple[str, ...] = get_args(Status)

EXPECTED_SHAPE: dict[str, Any] = {
    "objective": "What the change is meant to achieve (non-empty string).",
    "background": ["Context a reviewer needs (strings; may be empty)."],
    "changeSummary": "What was changed (non-empty string).",
    "scope": ["What to review: paths, modules or behaviours (at least one)."],
    "acceptanceCriteria": ["What must hold for the change to be right (at least one)."],
    "verification": {"status": "provided", "evidence": [{"check": "pytest -q", "outcome": "41 passed"}]},
    "knownLimitations": ["Optional."],
    "exclusions": ["Optional: what not to review."],
}
NOT_RUN_EXAMPLE = {"status": "not_run", "reason": "Why nothing was verified."}


class ReviewRequestInvalid(Invalid):
    code = "invalid_review_request"


class LegacyPromptRequest(Invalid):
    code = "legacy_prompt_request"


def legacy_prompt_error() -> LegacyPromptRequest:
    return LegacyPromptRequest(
        "The {prompt} request shape is no longer accepted: send the structured review request instead, "
        "{objective, background[], changeSummary, scope[], acceptanceCriteria[], "
        "verification {status: provided|not_run, evidence[{check, outcome}] | reason}, knownLimitations[], "
        "exclusions[]}. Put the goal in objective, the change in changeSummary and what to look at in scope.",
        fields={"prompt": ["no longer accepted; use the shape in expected_shape"]},
        extra={"expected_shape": EXPECTED_SHAPE, "verification_not_run_example": NOT_RUN_EXAMPLE},
    )


# ---------------------------------------------------------------- the rules of one value


def _problem(message: str) -> PydanticCustomError:
    return PydanticCustomError("review_request", message)


class _Rule:
    """A value's own rules, around pydantic's type check (`wrong_type`: how a value of
    the wrong type reads); `json` adds the limits to the schema."""

    wrong_type: str | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(self.validate, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> Any:
        return {**handler(schema), **self.json()}

    def validate(self, value: Any, handler: core_schema.ValidatorFunctionWrapHandler) -> Any:
        self.before(value)
        try:
            value = handler(value)
        except ValidationError as exc:
            if self.wrong_type and any(not e["loc"] for e in exc.errors()):  # the value itself, not an item
                raise _problem(self.wrong_type) from exc
            raise
        return self.check(value)

    def before(self, value: Any) -> None:
        pass

    def check(self, value: Any) -> Any:
        return value

    def json(self) -> dict[str, Any]:
        return {}


class _Text(_Rule):
    """Trimmed; then not blank, no NUL, valid Unicode, at most MAX_STRING characters."""

    def check(self, value: str) -> str:
        text = value.strip()
        if not text:
            raise _problem("must not be blank")
        if "\x00" in text:
            raise _problem("must not contain NUL characters")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _problem("must be valid Unicode text (no lone surrogates)") from None
        if len(text) > MAX_STRING:
            raise _problem(f"must be at most {MAX_STRING} characters")
        return text

    def json(self) -> dict[str, Any]:
        return {"minLength": 1, "maxLength": MAX_STRING, "pattern": r"\S"}


@dataclass(frozen=True)
class _Array(_Rule):
    """Its size is checked before its items are."""

    wrong_type: str | None
    min_items: int = 0

    def before(self, value: Any) -> None:
        if isinstance(value, list) and len(value) < self.min_items:
            raise _problem("must have at least one item")
        if isinstance(value, list) and len(value) > MAX_ITEMS:
            raise _problem(f"must have at most {MAX_ITEMS} items")

    def json(self) -> dict[str, Any]:
        return {"maxItems": MAX_ITEMS, **({"minItems": self.min_items} if self.min_items else {})}


@dataclass(frozen=True)
class _Typed(_Rule):
    """Only the wording of a value of the wrong type (an object, one of the statuses)."""

    wrong_type: str | None


class _Reference(_Rule):
    """A mission or feature: an id (a positive integer) or a key (a string)."""

    def validate(self, value: Any, handler: core_schema.ValidatorFunctionWrapHandler) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise _problem("must be an id (integer) or a key (string)")
        if isinstance(value, int):
            if not 1 <= value <= MAX_ID:
                raise _problem("must be a positive id")
            return value
        return _Text().check(value)

    def json(self) -> dict[str, Any]:
        return {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_ID},
                {"type": "string", **_Text().json()},
            ]
        }


class _Revision(_Rule):
    def check(self, value: str) -> str:
        if len(value) > MAX_REVISION or value.startswith("-") or any(c.isspace() for c in value):
            raise _problem(f"must be a commit-ish without spaces, at most {MAX_REVISION} characters")
        return value

    def json(self) -> dict[str, Any]:
        return {"maxLength": MAX_REVISION, "pattern": r"^[^-\s]\S*$"}


Text = Annotated[str, _Text()]
Texts = Annotated[list[Text], _Array("must be an array of strings")]
NonEmptyTexts = Annotated[list[Text], _Array("must be an array of strings", min_items=1)]


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _optional(**kwargs: Any) -> Any:
    """Not required, yet never null once given: an omitted key stays out of `model_fields_set`."""
    return Field(default=None, json_schema_extra=_no_default, **kwargs)


class _Closed(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", field_title_generator=lambda name, _: name)


class ReviewEvidence(_Closed):
    """One check that was run and what it gave."""

    check: Text
    outcome: Text


class ReviewVerification(_Closed):
    """`{status: provided, evidence: [...]}` (at least one entry) or `{status: not_run, reason}`."""

    status: Annotated[Status, _Typed("must be 'provided' or 'not_run'")]
    evidence: Annotated[
        list[Annotated[ReviewEvidence, _Typed("must be an object with check and outcome")]],
        _Array("must be an array of {check, outcome} objects"),
    ] = Field(default_factory=list)
    reason: Text = _optional()

    @model_validator(mode="wrap")
    @classmethod
    def _status_rules(cls, data: Any, handler: Any) -> Any:
        """The cross-field rule, told along with the problems of the fields themselves."""
        try:
            result, found = handler(data), []
        except ValidationError as exc:
            result, found = None, exc.errors()
        more = _status_problems(data, found) if isinstance(data, dict) else []
        if found or more:
            raise ValidationError.from_exception_data(cls.__name__, [*map(_again, found), *more])
        return result

    def normalized(self) -> dict[str, Any]:
        if self.status == "provided":
            return {"status": "provided", "evidence": [e.model_dump() for e in self.evidence]}
        return {"status": "not_run", "evidence": [], "reason": self.reason}


def _status_problems(value: dict, found: list[ErrorDetails]) -> list[InitErrorDetails]:
    status = value.get("status") if value.get("status") in STATUSES else None
    evidence_ok = not any(e["loc"][:1] == ("evidence",) for e in found)
    problems: list[tuple[str, str]] = []
    if status == "provided":
        if "evidence" in value and evidence_ok and not value["evidence"]:
            problems.append(("evidence", "must not be empty when status is 'provided'"))
        elif "evidence" not in value:
            problems.append(("evidence", "is required when status is 'provided'"))
        if "reason" in value:
            problems.append(("reason", "is not allowed when status is 'provided'"))
    elif status == "not_run":
        if "reason" not in value:
            problems.append(("reason", "is required when status is 'not_run'"))
        if isinstance(value.get("evidence"), list) and value["evidence"]:
            problems.append(("evidence", "must be empty when status is 'not_run'"))
    return [{"type": _problem(message), "loc": (name,), "input": value.get(name)} for name, message in problems]


def _again(error: ErrorDetails) -> InitErrorDetails:
    """An error pydantic reported, raised again with the cross-field ones."""
    kind = PydanticCustomError(error["type"], error["msg"], error.get("ctx"))
    return {"type": kind, "loc": error["loc"], "input": error["input"]}


# Its fields are declared in the order their problems are told; the normalized request
# writes them in `CORE_KEYS` order, then the references given. (The docstring is the
# schema's description, published in the API's docs.)
class ReviewRequest(_Closed):
    """A review request: what the change is meant to do, what changed and how it was
    verified, optionally tied to a mission, a feature and a revision."""

    objective: Text = Field(description="What the change is meant to achieve.")
    changeSummary: Text = Field(description="What was changed.")
    background: Texts = Field(description="Context a reviewer needs (may be empty).")
    scope: NonEmptyTexts = Field(description="What to review: paths, modules or behaviours.")
    acceptanceCriteria: NonEmptyTexts = Field(description="What must hold for the change to be right.")
    verification: Annotated[ReviewVerification, _Typed("must be an object with status and evidence or reason")]
    knownLimitations: Texts = Field(default_factory=list)
    exclusions: Texts = Field(default_factory=list, description="What not to review.")
    mission: Annotated[int | str, _Reference()] = _optional(description="Mission id or key.")
    feature: Annotated[int | str, _Reference()] = _optional(description="Feature id (or key with mission).")
    revision: Annotated[Text, _Revision()] = _optional(description="Commit to review (default: the workspace HEAD).")


def review_request_json_schema() -> dict[str, Any]:
    """The JSON schema of a review request body."""
    return ReviewRequest.model_json_schema()


# ---------------------------------------------------------------- errors in the contract's wording

_WORDING = {
    "missing": "is required",
    "extra_forbidden": "unknown field",
    "string_type": "must be a string",
}


def _path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else f"{path}.{part}" if path else str(part)
    return path


def _errors(exc: ValidationError) -> list[tuple[str, str]]:
    """(path, message) per problem, in the contract's order: an object's unknown keys first,
    by name, then its fields in their declared order."""
    found = exc.errors(include_url=False)
    first: dict[tuple, int] = {}
    for n, error in enumerate(found):
        for depth in range(len(error["loc"])):
            first.setdefault(tuple(error["loc"][:depth]), n)

    def rank(item: tuple[int, ErrorDetails]) -> tuple:
        n, error = item
        loc = tuple(error["loc"])
        if error["type"] == "extra_forbidden":
            return (first[loc[:-1]], len(loc) - 1, str(loc[-1]), n)
        return (n, len(loc) + 1, "", n)

    out = []
    for _, error in sorted(enumerate(found), key=rank):
        out.append((_path(tuple(error["loc"])), _WORDING.get(error["type"], error["msg"])))
    return out


def normalize_request(body: Any) -> dict[str, Any]:
    """Validate and normalize a review request; raise with every problem at once."""
    if not isinstance(body, dict):
        raise ReviewRequestInvalid("the review request must be a JSON object", fields={"": ["must be a JSON object"]})
    if "prompt" in body:
        raise legacy_prompt_error()
    try:
        request = ReviewRequest.model_validate(body)
    except ValidationError as exc:
        raise _invalid(_errors(exc)) from None
    out = {key: getattr(request, key) for key in CORE_KEYS}
    out["verification"] = request.verification.normalized()
    out.update({key: getattr(request, key) for key in REFERENCE_KEYS if key in request.model_fields_set})
    if len(canonical(out)) > MAX_CANONICAL_BYTES:
        raise ReviewRequestInvalid(
            f"the review request is larger than {MAX_CANONICAL_BYTES} bytes",
            code="review_request_too_large",
            fields={"": ["too large"]},
        )
    return out


def _invalid(errors: list[tuple[str, str]]) -> ReviewRequestInvalid:
    listed = "; ".join(f"{path}: {message}" for path, message in errors)
    fields: dict[str, list[str]] = {}
    for path, message in errors:
        fields.setdefault(path, []).append(message)
    return ReviewRequestInvalid(
        f"the review request is invalid: {listed}",
        fields=fields,
        extra={"errors": [{"path": p, "message": m} for p, m in errors]},
    )


def review_subject(request: dict[str, Any]) -> dict[str, Any]:
    """What the reviewers are asked about: the normalized core fields only."""
    return {key: request[key] for key in CORE_KEYS}


def canonical_text(value: Any) -> str:
    return canonical(value).decode("utf-8")


def request_digest(request: dict[str, Any]) -> tuple[str, str]:
    """(RFC 8785 canonical JSON, its sha256)."""
    return canonical_text(request), sha256_of(request)
