"""Validator kinds. `judge(ctx)` dispatches on the profile's kind and returns a
candidate verdict document (a dict) plus token usage; the runner host-validates it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fusion_site.repos.snapshots import private_copy
from validation.context import ValidationContext, ValidatorCrashed


@dataclass
class Judgement:
    candidate: dict[str, Any]
    tokens_in: int = 0
    tokens_out: int = 0
    # Set when a check ran in the snapshot itself: each file evidence text, judged against
    # the snapshot before that check started (validation.verdict.FrozenContext.file_refs).
    file_refs: dict[str, str | None] | None = None


def judge(ctx: ValidationContext) -> Judgement:
    # The kinds are imported on use: each imports `Judgement` from this package (a cycle at
    # the top of the module), and the agent kind loads pydantic-ai, heavy, only when judging.
    kind = ctx.profile["kind"]
    if kind == "checks":
        from validation.validators.composite import judge_checks_only

        return judge_checks_only(ctx)
    if kind == "composite":
        from validation.validators.composite import judge_composite

        return judge_composite(ctx)
    if kind == "agent":
        from validation.validators.agent import judge_agent
        from validation.validators.composite import with_declared_checks

        return with_declared_checks(ctx, judge_agent(ctx))
    if kind == "command":
        from validation.validators.command import judge_command
        from validation.validators.composite import with_declared_checks

        with own_workdir(ctx) as own:
            judged = judge_command(own)
        return with_declared_checks(ctx, judged)
    raise ValidatorCrashed(f"unknown validator kind {kind!r}", code="misconfigured")


@contextlib.contextmanager
def own_workdir(ctx: ValidationContext) -> Iterator[ValidationContext]:
    """`ctx` with a private copy of the prepared checkout as the validator's `workdir`,
    removed afterwards: what a command validator's CLI generates, edits or deletes (a
    `make`, an `npm install`, a restored protected test rewritten) never reaches the tree
    the host's declared checks and host validation judge (docs/TRUTH.md). A replay
    invokes nothing: it needs no copy."""
    if ctx.replay is not None or ctx.checkout is None:
        yield ctx
        return
    with private_copy(ctx.checkout) as copy:
        yield dataclasses.replace(ctx, workdir=copy)
