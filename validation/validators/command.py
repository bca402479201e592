"""The `command` validator (docs/validators.md, "`command`"): an external agent CLI run in a private copy of the
checkout (`ValidationContext.workdir`) with the prompt on stdin; its standard output must be the verdict JSON.
Its file evidence is judged against the checkout itself, as host validation judges it.

The parse is strict: the whole of stdout is one JSON document, or else it holds exactly
one ```json fenced block (accepted, and the decision records `parse: fenced`). Anything
else is a schema rejection. A repair is a new invocation whose stdin is the prompt plus
the previous answer and the rejection reasons. Each invocation is journaled like a model
call, so a replay serves it and a resumed run does not invoke the command again.
Standard error goes to a side file (its tail is journaled) so it never pollutes the JSON.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.conf import settings

from fusion_site.runtime.proc import CommandError, Unconfined, run_command, scrubbed_env
from fusion_site.runtime.redact import redact
from fusion_site.runtime.sandbox import Confinement, Toolchain
from validation import journal
from validation.context import ValidationContext, ValidatorCrashed
from validation.validators import Judgement
from validation.validators.prompt import command_prompt, prompts
from validation.validators.repair import DEFAULT_MAX_REPAIRS, RepairsExhausted, decide
from validation.verdict import FrozenContext

FENCED = re.compile(r"```json[ \t]*\r?\n(.*?)\r?\n[ \t]*```", re.S)
MAX_STDOUT = 512 * 1024
PREVIOUS_ANSWER_LIMIT = 8000
STDERR_TAIL = 4000


@dataclass
class CommandOptions:
    command: str | list[str]
    shell: bool = False
    timeout: int = 300
    max_repairs: int = DEFAULT_MAX_REPAIRS
    journal_policy: str = "transcript"
    api_key_env: str = ""
    network: bool = True  # an agent CLI talks to its model (docs/SANDBOX.md)

    @classmethod
    def from_profile(cls, profile: dict[str, Any]) -> CommandOptions:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in profile.items() if k in names})

    def argv(self) -> list[str]:
        # stderr is redirected by a tiny sh wrapper: run_command merges it into stdout otherwise.
        if self.shell:
            command = self.command if isinstance(self.command, str) else shlex.join(self.command)
            return ["sh", "-c", "( " + command + '\n) 2>"$FUSION_VALIDATOR_STDERR"']
        argv = self.command if isinstance(self.command, list) else shlex.split(self.command)
        return ["sh", "-c", 'exec "$@" 2>"$FUSION_VALIDATOR_STDERR"', "fusion-validator", *argv]

    def confinement(self, workdir: Path, stderr: Path) -> Confinement:
        """The validator's program runs in the sandbox too, in its own copy, with the
        network (its model) unless the profile says `network: false`. The program and the
        files its command names by absolute path are the staff's: mounted read-only."""
        words = self.command if isinstance(self.command, list) else shlex.split(self.command)
        named = [Path(w) for w in words if w.startswith("/") and Path(w).exists()]
        readable = {mount for p in named if (mount := _program_mount(p)) is not None}
        return Confinement(
            tree=workdir,
            writable=(stderr,),
            readable=tuple(sorted(readable)),
            network=self.network,
            limits=False,
        )


def _program_mount(path: Path) -> Path | None:
    """What of `path`, named by the validator's command, its sandbox reads: a program in a
    `bin` folder brings its prefix (a virtualenv's `pyvenv.cfg` and `lib`), any other file
    itself, a folder itself. Never a folder holding the service's state (the data folder,
    snapshots, mirrors, environments): `/work` named on the command line does not open
    the data folder under it."""
    mount = path.parent.parent if path.is_file() and path.parent.name == "bin" else path
    state = [Path(settings.DATA_DIR), *(Path(getattr(settings, name)) for name in STATE_FOLDERS)]
    if any(folder.resolve().is_relative_to(mount.resolve()) for folder in state):
        return path if path.is_file() else None
    return mount


STATE_FOLDERS = ("FUSION_SNAPSHOT_DIR", "FUSION_REPO_CACHE", "FUSION_ENV_CACHE")


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs):
    keys = [k for k, _v in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate keys")
    return dict(pairs)


def _strict_json(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constants, object_pairs_hook=_unique_keys)


def read_stdout(text: str) -> tuple[Any, str]:
    """(candidate, how it was read): json | fenced | text (unreadable: judged as schema-invalid)."""
    try:
        return _strict_json(text.strip()), "json"
    except ValueError:
        pass
    blocks = FENCED.findall(text)
    if len(blocks) == 1:
        try:
            return _strict_json(blocks[0]), "fenced"
        except ValueError:
            pass
    return text, "text"


def _invoke(options: CommandOptions, checkout: Path, stdin: str, tools: Toolchain | None = None) -> dict[str, Any]:
    """`tools`: the run's environment (docs/ENVIRONMENTS.md), as a check gets it."""
    tools = tools or Toolchain()
    with tempfile.NamedTemporaryFile(prefix="fusion-validator-stderr-", delete=False) as err:
        err_path = err.name
    extra = {"FUSION_VALIDATOR_STDERR": err_path}
    if options.api_key_env and os.environ.get(options.api_key_env):
        extra[options.api_key_env] = os.environ[options.api_key_env]
    confine = options.confinement(checkout, Path(err_path))
    confine = replace(confine, readable=(*confine.readable, *tools.readable), binds=tools.binds)
    try:
        result = run_command(
            options.argv(),
            cwd=checkout,
            timeout=options.timeout,
            max_output=MAX_STDOUT,
            stdin=stdin,
            env=scrubbed_env({**tools.env, **extra}, path=tools.path),
            confine=confine,
        )
        stderr = Path(err_path).read_bytes()[-STDERR_TAIL:].decode("utf-8", errors="replace")
    except Unconfined as exc:
        raise ValidatorCrashed(str(exc), code="sandbox_unavailable") from exc
    except CommandError as exc:
        raise ValidatorCrashed(f"the validator command cannot start: {exc}", code="misconfigured") from exc
    finally:
        os.unlink(err_path)
    return {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "truncated": result.truncated,
        "stdout": result.output,
        "stderr_tail": redact(stderr),
        "duration": round(result.duration, 3),
    }


def _repair_text(previous: str, feedback: str) -> str:
    shown = previous if len(previous) <= PREVIOUS_ANSWER_LIMIT else previous[:PREVIOUS_ANSWER_LIMIT] + "\n[… truncated]"
    return f"\n## Repair\nYour previous answer was:\n{shown}\n\n{feedback}\n"


def _check_exit(answer: dict[str, Any], options: CommandOptions) -> None:
    if answer["timed_out"]:
        raise ValidatorCrashed(
            f"the validator command did not finish within {options.timeout}s and was killed", code="timeout"
        )
    if answer["exit_code"] != 0:
        tail = (answer.get("stderr_tail") or answer["stdout"])[-1000:]
        raise ValidatorCrashed(f"the validator command exited {answer['exit_code']}: {tail}", code="validator_error")


def judge_command(ctx: ValidationContext) -> Judgement:
    options = CommandOptions.from_profile(ctx.profile)
    log = journal.CallLog(ctx.run_id, live=ctx.replay is None)
    system, user = prompts(ctx, log, validator="command")
    prompt, repair = command_prompt(system, user), ""
    frozen = FrozenContext(keys=ctx.keys, checkout=ctx.checkout)
    for attempt in range(options.max_repairs + 1):
        stdin = prompt + repair
        request = {
            "ordinal": attempt + 1,
            "command": options.command,
            "stdin_sha256": journal.sha256_of(stdin),
            "stdin_chars": len(stdin),
            "repair": repair,
        }
        key = f"command:{attempt + 1}:{journal.sha256_of(request)[:16]}"
        answer, _served = log.call(
            request_kind="model_request",
            response_kind="model_response",
            key=key,
            request=request,
            live_fn=lambda stdin=stdin: _invoke(options, ctx.workdir or ctx.checkout, stdin, ctx.toolchain),
            what=f"command invocation {attempt + 1}",
        )
        _check_exit(answer, options)
        candidate, parse = read_stdout(answer["stdout"])
        decision, _verdict = decide(
            log=log,
            candidate=candidate,
            frozen=frozen,
            call_id=f"command-{attempt + 1}",
            repairs_used=attempt,
            max_repairs=options.max_repairs,
            policy=options.journal_policy,
            parse=parse,
        )
        if decision.verdict == "accepted":
            return Judgement(candidate)
        if decision.verdict == "rejected":
            raise RepairsExhausted(decision)
        repair = _repair_text(answer["stdout"], decision.feedback())
    raise AssertionError("unreachable: the last attempt is accepted or rejected")  # pragma: no cover
