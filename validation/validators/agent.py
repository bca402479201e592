"""The `agent` validator (docs/validators.md, "`agent`"): a fresh pydantic-ai agent per run, read-only tools
confined to the checkout, the verdict as structured output, host validation with bounded
repair, and every exchange journaled so that a run replays and resumes without paying twice.

Model calls go through `JournaledModel`: call n is keyed by its ordinal and the hash of
its request, served from the journal when answered, else sent and journaled. Tool calls
are keyed by the model call that asked for them and their call id. Database writes run
in the calling (worker) thread through `sync_to_async`, while the agent itself runs on an
event loop of its own (`async_to_sync`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db.models import F
from pydantic import BaseModel, ConfigDict
from pydantic_ai import Agent, AgentRetries, ModelRetry, RunContext, Tool
from pydantic_ai.exceptions import ModelAPIError, ModelHTTPError, UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import Model
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.output import NativeOutput, PromptedOutput, ToolOutput
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

from validation import journal
from validation.context import ValidationContext, ValidatorCrashed
from validation.models import ValidatorRun
from validation.validators import Judgement, schema_mode
from validation.validators import tools as checkout_tools
from validation.validators.agent_models import resolve_model
from validation.validators.prompt import prompts, verdict_schema
from validation.validators.repair import DEFAULT_MAX_REPAIRS, RepairsExhausted, decide
from validation.verdict import FrozenContext

TOOL_NAMES = ("read", "grep", "find", "ls", "run_check")
VOLATILE = {"timestamp", "run_id", "conversation_id"}  # differ between two sends of the same request


class BudgetExceeded(ValidatorCrashed):
    retry = False  # the same run with the same budget would stop at the same place

    def __init__(self, message: str):
        super().__init__(message, code="budget_exceeded")


@dataclass
class AgentOptions:
    model: str
    base_url: str = ""
    api_key_env: str = ""
    temperature: float | None = None
    max_repairs: int = DEFAULT_MAX_REPAIRS
    timeout: int = 300
    token_budget: int | None = None
    output_mode: str = "tool"
    journal_policy: str = "transcript"
    tools: tuple[str, ...] = TOOL_NAMES
    tool_choice: str = "required"  # required | auto (server lacks "required") | output (name the output tool)
    native_format: str = "json_schema"  # json_schema | json_object (an OpenAI-compatible server's schema variant)
    schema_format: str = "openai"  # output_mode schema: the response_format form the server takes
    max_tokens: int | None = None
    # The request field a `base_url` server reads the output limit from: `max_tokens` is the
    # one every OpenAI-compatible server takes (llama-cpp-python ignores the other, and a
    # limit it ignores is no limit); OpenAI's reasoning models want `max_completion_tokens`.
    max_tokens_field: str = "max_tokens"
    max_requests: int = 40

    @classmethod
    def from_profile(cls, profile: dict[str, Any]) -> AgentOptions:
        names = {f for f in cls.__dataclass_fields__}
        options = {k: v for k, v in profile.items() if k in names}
        if "tools" in options:
            options["tools"] = tuple(options["tools"])
        return cls(**options)


class Candidate(BaseModel):
    """Whatever the model submits, kept whole: the schema check is the host's (it is
    journaled and repaired like any other rejection). The model sees the Verdict schema."""

    model_config = ConfigDict(extra="allow")

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):
        return verdict_schema()


def request_document(messages, params, schema_sha256: str = "") -> dict[str, Any]:
    dumped = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    document = {
        "messages": _strip(dumped),
        "tools": sorted(t.name for t in params.function_tools),
        "output_tools": sorted(t.name for t in params.output_tools),
        "output_mode": params.output_mode,
    }
    if schema_sha256:  # the schema is sent outside the messages: the request hash must cover it
        document["verdict_schema_sha256"] = schema_sha256
    return document


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


@dataclass
class AgentSession:
    """The state of one agent run: journal, counters, the accepted candidate."""

    ctx: ValidationContext
    options: AgentOptions
    log: journal.CallLog
    ordinal: int = 0
    sent: int = 0  # messages already journaled in earlier requests
    tokens_in: int = 0
    tokens_out: int = 0
    accepted: dict[str, Any] | None = None
    last_reasons: list[str] = field(default_factory=list)
    schema: schema_mode.RunSchema | None = None  # output_mode schema only

    @property
    def frozen(self) -> FrozenContext:
        return FrozenContext(keys=self.ctx.keys, checkout=self.ctx.checkout)

    # --- model calls ------------------------------------------------------------------
    def served(self, key: str) -> ModelResponse | None:
        payload = self.log.answer("model_response", key)
        if payload is None:
            return None
        self.account(payload["usage"])
        message = ModelMessagesTypeAdapter.validate_python([payload["response"]])[0]
        if not isinstance(message, ModelResponse):  # only `record_response` writes this kind
            raise journal.JournalIntegrityError(f"the journaled answer {key} is not a model response")
        return message

    def check_budget(self, estimate: int) -> None:
        budget = self.options.token_budget
        used = self.tokens_in + self.tokens_out
        if budget is not None and used + estimate > budget:
            # Phrased without "token <word>": the secret redactor would eat the number.
            raise BudgetExceeded(
                f"the run's budget of {budget} tokens would be exceeded: {used} tokens used, the next "
                f"model request needs about {estimate}; stopped before sending it"
            )

    def record_response(self, key: str, payload: dict[str, Any]) -> None:
        self.log.record("model_response", key, payload)
        usage = payload["usage"]
        ValidatorRun.objects.filter(pk=self.ctx.run_id).update(
            tokens_in=F("tokens_in") + usage["input_tokens"], tokens_out=F("tokens_out") + usage["output_tokens"]
        )

    def account(self, usage: dict[str, int]) -> None:
        self.tokens_in += usage["input_tokens"]
        self.tokens_out += usage["output_tokens"]

    # --- tools ------------------------------------------------------------------------
    async def tool(self, ctx: RunContext, name: str, **args: Any) -> str:
        key = f"tool:{self.ordinal}:{ctx.tool_call_id}:{journal.sha256_of(args)[:8]}"
        answer, _served = await sync_to_async(self.log.call)(
            request_kind="tool_call",
            response_kind="tool_result",
            key=key,
            request={"name": name, "args": args, "call_id": ctx.tool_call_id, "model_call": self.ordinal},
            live_fn=lambda: {"name": name, "output": self._run_tool(name, args)},
            what=f"tool call {name} {args}",
        )
        return answer["output"]

    def _run_tool(self, name: str, args: dict[str, Any]) -> str:
        if name == "run_check":
            return checkout_tools.run_check(self.ctx, args["key"])
        return checkout_tools.TOOL_FUNCTIONS[name](self.ctx.checkout, **args)

    # --- host validation --------------------------------------------------------------
    def judge(self, candidate: Any, call_id: str, repairs_used: int, parse: str = "json"):
        decision, verdict = decide(
            parse=parse,
            log=self.log,
            candidate=candidate,
            frozen=self.frozen,
            call_id=call_id,
            repairs_used=repairs_used,
            max_repairs=self.options.max_repairs,
            policy=self.options.journal_policy,
            extra={"model_call": self.ordinal},
        )
        self.last_reasons = decision.reasons()
        return decision


class JournaledModel(WrapperModel):
    """Serves answered model calls from the journal; sends and journals the others."""

    def __init__(self, wrapped: Model, session: AgentSession):
        super().__init__(wrapped)
        self.session = session

    async def request(self, messages, model_settings, model_request_parameters) -> ModelResponse:
        s = self.session
        s.ordinal += 1
        schema_sha256 = s.schema.sha256 if s.schema else ""
        document = request_document(messages, model_request_parameters, schema_sha256)
        digest = journal.sha256_of(document)
        key = f"model:{s.ordinal}:{digest[:16]}"
        new_messages, s.sent = document["messages"][s.sent :], len(messages)
        response = s.served(key)
        if response is not None:
            return response
        refused = s.log.answer("model_refusal", key)
        if refused is not None:  # resumed or replayed: the server's refusal is the journaled answer
            raise ValidatorCrashed(refused["message"], code="misconfigured")
        if not s.log.live:
            raise journal.JournalMiss(
                f"model call {s.ordinal} (request sha256 {digest[:16]}) is not in the journal; "
                "a replay never makes a live call",
                in_flight=s.log.answer("model_request", key) is not None,
                past_end=s.ordinal > s.log.last_model_call(),
            )
        s.check_budget(len(journal.canonical(document)) // 4 + 1)
        await sync_to_async(s.log.record)(
            "model_request",
            key,
            {
                "ordinal": s.ordinal,
                "request_sha256": digest,
                "new_messages": new_messages,
                "tools": document["tools"],
                "output_tools": document["output_tools"],
                "output_mode": document["output_mode"],
                **({"verdict_schema_sha256": schema_sha256} if schema_sha256 else {}),
            },
        )
        try:
            response = await self.wrapped.request(messages, model_settings, model_request_parameters)
        except ModelHTTPError as exc:
            refused = s.schema and schema_mode.refusal(
                exc, schema_format=s.schema.schema_format, first_call=s.ordinal == 1
            )
            if not refused:
                raise
            await sync_to_async(s.log.record)(
                "model_refusal", key, {"ordinal": s.ordinal, "status": exc.status_code, "message": str(refused)}
            )
            raise refused from exc
        usage = {"input_tokens": response.usage.input_tokens or 0, "output_tokens": response.usage.output_tokens or 0}
        await sync_to_async(s.record_response)(
            key,
            {
                "ordinal": s.ordinal,
                "request_sha256": digest,
                "usage": usage,
                "model": response.model_name,
                "response": ModelMessagesTypeAdapter.dump_python([response], mode="json")[0],
            },
        )
        s.account(usage)
        return response

    def request_stream(self, *args, **kwargs):  # pragma: no cover - the validator never streams
        raise NotImplementedError("the journaled validator model does not stream")


def _output_spec(session: AgentSession) -> Any:
    options = session.options
    if options.output_mode == "schema":
        return schema_mode.output_spec(session.ctx.keys)
    if options.output_mode == "native":
        return NativeOutput(Candidate, name="verdict", description="The verdict document")
    if options.output_mode == "prompted":
        return PromptedOutput(Candidate, name="verdict", description="The verdict document")
    return ToolOutput(Candidate, name="submit_verdict", description="Submit the complete verdict document")


def _tool_list(session: AgentSession) -> list[Tool]:
    async def read(ctx: RunContext, path: str, offset: int = 1, limit: int = 200) -> str:
        """Read numbered lines of a file of the checkout (path relative to its root)."""
        return await session.tool(ctx, "read", path=path, offset=offset, limit=limit)

    async def grep(ctx: RunContext, pattern: str, path: str = ".", glob: str = "*") -> str:
        """Search files of the checkout for a regular expression; answers path:line: text."""
        return await session.tool(ctx, "grep", pattern=pattern, path=path, glob=glob)

    async def find(ctx: RunContext, pattern: str, path: str = ".") -> str:
        """List files of the checkout whose path or name matches a glob pattern."""
        return await session.tool(ctx, "find", pattern=pattern, path=path)

    async def ls(ctx: RunContext, path: str = ".") -> str:
        """List a directory of the checkout."""
        return await session.tool(ctx, "ls", path=path)

    async def run_check(ctx: RunContext, key: str) -> str:
        """Run the declared deterministic check of one linked assertion and get its result."""
        return await session.tool(ctx, "run_check", key=key)

    functions: dict[str, Callable[..., Awaitable[str]]] = {
        "read": read,
        "grep": grep,
        "find": find,
        "ls": ls,
        "run_check": run_check,
    }
    return [Tool(functions[name], takes_ctx=True) for name in session.options.tools if name in functions]


def build_agent(session: AgentSession, system: str) -> Agent[Any, Any]:
    options = session.options
    settings: ModelSettings = {"timeout": float(options.timeout)}
    if options.temperature is not None:
        settings["temperature"] = float(options.temperature)
    if options.max_tokens:
        settings["max_tokens"] = options.max_tokens
    if options.output_mode == "tool" and options.tool_choice == "output":
        settings["tool_choice"] = ["submit_verdict"]
    if session.schema is not None:
        settings["extra_body"] = session.schema.model_settings()
    model = JournaledModel(resolve_model(options, replay=not session.log.live), session)
    retries: AgentRetries = {"output": options.max_repairs, "tools": 2}
    agent = Agent(
        model,
        output_type=_output_spec(session),
        system_prompt=system,
        tools=_tool_list(session),
        retries=retries,
        model_settings=settings,
    )

    @agent.output_validator
    async def host_validation(ctx: RunContext, candidate: Any) -> Any:
        call_id = f"{session.ordinal}:{ctx.tool_call_id or 'text'}"
        if isinstance(candidate, schema_mode.SchemaAnswer):  # read and converted by the host
            document, parse = candidate.candidate, candidate.parse
        else:
            document, parse = candidate.model_dump(), "json"
        decision = await sync_to_async(session.judge)(document, call_id, ctx.retry, parse)
        if decision.verdict == "accepted":
            session.accepted = document
            return candidate
        if decision.verdict == "repair":
            raise ModelRetry(decision.feedback())
        raise RepairsExhausted(decision)

    return agent


async def _run(agent: Agent[Any, Any], user: str, options: AgentOptions) -> None:
    limits = UsageLimits(request_limit=options.max_requests)
    await asyncio.wait_for(agent.run(user, usage_limits=limits), timeout=options.timeout)


def judge_agent(ctx: ValidationContext) -> Judgement:
    options = AgentOptions.from_profile(ctx.profile)
    log = journal.CallLog(ctx.run_id, live=ctx.replay is None)
    session = AgentSession(ctx=ctx, options=options, log=log)
    system, user = prompts(ctx, log, validator="agent")
    if options.output_mode == "schema":
        session.schema = schema_mode.run_schema(ctx, log, schema_format=options.schema_format)
        system = f"{system}\n\n{session.schema.instructions}"
    agent = build_agent(session, system)
    try:
        async_to_sync(_run)(agent, user, options)
    except UnexpectedModelBehavior as exc:
        last = "; ".join(session.last_reasons)[:2000]
        raise ValidatorCrashed(
            f"the model's output stayed unusable: {exc}" + (f"; last rejection: {last}" if last else ""),
            code="invalid_verdict",
        ) from exc
    except UsageLimitExceeded as exc:
        raise ValidatorCrashed(f"the agent hit its request limit: {exc}", code="limit_exceeded") from exc
    except TimeoutError as exc:  # before OSError: TimeoutError is one
        raise ValidatorCrashed(f"the agent did not finish within {options.timeout}s", code="timeout") from exc
    except (ModelAPIError, OSError) as exc:
        raise ValidatorCrashed(f"the model could not be reached: {exc}", code="model_unavailable") from exc
    if session.accepted is None:  # pragma: no cover - the output validator accepts before the run returns
        raise ValidatorCrashed("the agent ended without an accepted verdict", code="invalid_verdict")
    return Judgement(session.accepted, session.tokens_in, session.tokens_out)
