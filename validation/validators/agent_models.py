"""Which model the `agent` validator talks to (docs/validators.md, "`agent`"): an
in-process one a program registered (a scripted `FunctionModel` in tests), an
OpenAI-compatible server at `base_url` (with what such servers do and do not accept), or
a provider's model by name."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

from pydantic_ai.exceptions import UserError
from pydantic_ai.models import Model

from validation.context import ValidatorCrashed


class ModelChoice(Protocol):
    """The options that choose the model (`agent.AgentOptions` has them)."""

    model: str
    base_url: str
    api_key_env: str
    tool_choice: str
    native_format: str
    max_tokens_field: str


REPLAY_KEY = "replay-no-key"

_REGISTERED: dict[str, Model | Callable[[], Model]] = {}


def register_model(name: str, model: Model | Callable[[], Model] | None) -> None:
    """An in-process model (a scripted `FunctionModel` in tests, an embedding program's own)
    that a profile names in `model`; None unregisters it."""
    if model is None:
        _REGISTERED.pop(name, None)
    else:
        _REGISTERED[name] = model


def _api_key(options: ModelChoice, replay: bool) -> str | None:
    if replay:
        return REPLAY_KEY  # the model is never called in a replay
    if not options.api_key_env:
        return None
    key = os.environ.get(options.api_key_env, "")
    if not key:
        raise ValidatorCrashed(
            f"the environment variable {options.api_key_env} named by api_key_env is not set", code="misconfigured"
        )
    return key


def resolve_model(options: ModelChoice, *, replay: bool) -> Model:
    if options.model in _REGISTERED:
        model = _REGISTERED[options.model]
        return model if isinstance(model, Model) else model()
    key = _api_key(options, replay)
    if options.base_url:
        return _compatible_model(options, key)
    # Provider clients load on use: only the configured one (each is heavy).
    from pydantic_ai.models import infer_model
    from pydantic_ai.providers import infer_provider, infer_provider_class

    # infer_provider_class is typed as the base Provider, whose __init__ takes nothing; the
    # concrete class it returns (OpenAIProvider, AnthropicProvider, ...) takes api_key.
    factory = (lambda name: infer_provider_class(name)(api_key=key)) if key else infer_provider  # type: ignore[call-arg]
    try:
        return infer_model(options.model, provider_factory=factory)
    except (UserError, ValueError, ImportError, TypeError) as exc:
        raise ValidatorCrashed(f"cannot use model {options.model!r}: {exc}", code="misconfigured") from exc


def _compatible_model(options: ModelChoice, key: str | None) -> Model:
    """An OpenAI-compatible server at `base_url`, with what it does and does not accept."""
    # Loaded on use, like every provider client.
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.profiles import ModelProfile
    from pydantic_ai.profiles.openai import OpenAIModelProfile
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=options.base_url, api_key=key or "not-needed")
    base: ModelProfile = provider.model_profile(options.model) or {}
    profile: OpenAIModelProfile = {
        **base,
        "supports_json_schema_output": True,
        "supports_json_object_output": True,
        "supports_forced_tool_choice": options.tool_choice != "auto",
        "openai_supports_strict_tool_definition": False,
        "openai_chat_supports_max_completion_tokens": options.max_tokens_field == "max_completion_tokens",
    }
    json_object = options.native_format == "json_object"

    class CompatibleChatModel(OpenAIChatModel):
        async def _map_messages(self, *args, **kwargs):
            # An assistant turn that only calls tools has `content: null`, which OpenAI accepts
            # and llama.cpp's server refuses (500); an empty string means the same to both.
            mapped = await super()._map_messages(*args, **kwargs)
            for message in mapped:
                if message.get("role") == "assistant" and message.get("content") is None:
                    message["content"] = ""
            return mapped

        def _map_json_schema(self, o):
            # Some servers (llama.cpp) refuse `json_schema` but constrain `json_object` by a schema.
            return {"type": "json_object", "schema": o.json_schema} if json_object else super()._map_json_schema(o)

    return CompatibleChatModel(options.model, provider=provider, profile=profile)
