"""The `agent` validator's `schema` output mode (docs/validators.md, "`schema`"): the model
server decodes the final answer under this run's verdict schema (`validation.verdict_schema`),
sent as `response_format` in the form `schema_format` names, while the reading tools stay
offered. The answer arrives as text, is read by the host (raw control characters inside
strings tolerated) and converted to the contract's list form; host validation and bounded
repair then treat it like any other candidate.

The schema is journaled the first time a run builds it (a `note`, like the prompts), with
its sha256; a resumed or replayed run uses the journaled schema, so neither a later change
of this code nor a checkout that is gone changes what the run asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.output import TextOutput

from validation import journal
from validation.context import ValidationContext, ValidatorCrashed
from validation.verdict_schema import (
    DIALECTS,
    SCHEMA_VERSION,
    build_verdict_schema,
    checkout_files,
    parse_answer,
    response_format,
    to_contract,
)

NOTE_KEY = "verdict_schema:agent"
# HTTP statuses with which servers refuse a request body they do not take.
REFUSALS = (400, 415, 422, 501)

INSTRUCTIONS = """Answer with one JSON object and nothing else: {{"summary": "...", "assertions": {{KEY: \
{{"verdict": "pass" | "fail" | "blocked", "message": "...", "expected": "...", "actual": "...", \
"evidence": [...]}}}}}}, with exactly these keys under "assertions": {keys}. An evidence item is \
{{"kind": "file", "path": "<file of the checkout>", "line": <line number>}} or {{"kind": "command" | \
"test-output" | "other", "text": "..."}}. The server holds your answer to this shape; the host derives \
the overall status."""


@dataclass(frozen=True)
class RunSchema:
    schema: dict[str, Any]
    sha256: str
    schema_format: str
    instructions: str

    def model_settings(self) -> dict[str, Any]:
        """Sent as the request's `extra_body`: the client merges it into the request body."""
        return {"response_format": response_format(self.schema, schema_format=self.schema_format)}


@dataclass(frozen=True)
class SchemaAnswer:
    """The final answer as read by the host: the contract-form candidate and how it was read."""

    text: str
    candidate: Any
    parse: str


def run_schema(ctx: ValidationContext, log: journal.CallLog, *, schema_format: str) -> RunSchema:
    """This run's schema as journaled; built and journaled the first time."""
    stored = log.answer("note", NOTE_KEY)
    if stored is None:
        if not log.live:
            raise journal.JournalMiss("the verdict schema is not in the journal; a replay never rebuilds it")
        schema = build_verdict_schema(keys=ctx.keys, files=checkout_files(ctx.checkout), dialect=schema_format)
        stored = log.record(
            "note",
            NOTE_KEY,
            {
                "schema": schema,
                "sha256": journal.sha256_of(schema),
                "schema_format": schema_format,
                "version": SCHEMA_VERSION,
                "instructions": INSTRUCTIONS.format(keys=", ".join(ctx.keys)),
            },
        )
    return RunSchema(stored["schema"], stored["sha256"], stored["schema_format"], stored["instructions"])


def output_spec(keys: tuple[str, ...]) -> TextOutput[SchemaAnswer]:
    def read(text: str) -> SchemaAnswer:
        document, parse = parse_answer(text)
        return SchemaAnswer(text=text, candidate=to_contract(document, keys=keys), parse=parse)

    return TextOutput(read)


def refusal(exc: BaseException, *, schema_format: str, first_call: bool) -> ValidatorCrashed | None:
    """The run's error when the server refused the request because of its `response_format`
    (a refusal of the first request, or one whose message names the format); else None."""
    if not isinstance(exc, ModelHTTPError):
        return None
    body = str(exc.body or exc.message)
    named = any(word in body.lower() for word in ("response_format", "schema", "json"))
    # llama-cpp-python's server answers a response_format it does not take with a 500 that
    # names it; any other 500 is the server's trouble, not the format's.
    if not (exc.status_code in REFUSALS and (first_call or named)) and not (exc.status_code == 500 and named):
        return None
    others = ", ".join(f for f in DIALECTS if f != schema_format)
    return ValidatorCrashed(
        f"the model server refused the verdict schema (HTTP {exc.status_code}: {body[:300]}); it does not take "
        f"response_format as schema_format {schema_format!r} sends it: set the profile option schema_format to "
        f"one it accepts ({others}), or choose another output_mode",
        code="misconfigured",
    )
