"""Declared environments (docs/ENVIRONMENTS.md): what a mission, or a milestone
overriding it, sets up once before its checks run, built in the sandbox with the network,
kept in the cache (`fusion_site/runtime/envcache.py`) and mounted read-only into every check
with the same key.

The key is a hash of the repository, the key files' content in the run's snapshot (after
protection: what the build reads), the preset, the setup, the key file patterns and the
platform (the machine, and the base interpreter's path and version; node's for `node`).

A build that fails is one of two things. The revision changed a key file since the base
(the implementation broke its own environment): every run check of the run fails with the
build's log, and a fix follows. Otherwise (a registry down, a broken setup in the
contract, a mission without a base): the run ends `error` `environment_failed`, is
retried with backoff, and then blocks the feature for a person."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings

from fusion_site.repos.snapshots import SnapshotError, private_copy
from fusion_site.runtime import envcache, sandbox
from fusion_site.runtime.proc import CommandError, CommandResult, Unconfined, run_command, scrubbed_env
from fusion_site.runtime.redact import bounded, redact
from fusion_site.runtime.sandbox import Bind, Confinement, Toolchain
from missions.environment_spec import declared_for, effective
from missions.services.verdict_settings import mission_base
from validation import journal, protect
from validation.context import AssertionSpec, EnvironmentReport, ValidationContext, ValidatorCrashed
from validation.journal import sha256_of
from validation.verdict import AssertionVerdict, Evidence, escape_invisible

# Bumped when how an environment is built changes: every key changes with it.
RECIPE = 1
# The package-index settings of the service's own environment a build sees (a private
# mirror); nothing else of it reaches a build.
PASS_THROUGH = (
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_TRUSTED_HOST",
    "UV_INDEX_URL",
    "NPM_CONFIG_REGISTRY",
)
LOG_BYTES = 64 * 1024  # the tail of a build's output kept
LOG_SHOWN = 6000  # what the journal and the evidence show of it
# `https://user:secret@mirror/…`: an index URL with its credentials.
URL_CREDENTIALS = re.compile(r"(?<=://)[^\s/@:]+:[^\s/@]+@")
QUIET = {
    "python": {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"},
    "node": {"npm_config_audit": "false", "npm_config_fund": "false", "npm_config_update_notifier": "false"},
    "none": {},
}


def declared(run: Any) -> dict[str, Any] | None:
    """The environment a run uses (its milestone's own, else its mission's), with its defaults."""
    return effective(declared_for(run.mission.environment, run.milestone.environment))


def needed(run: Any, profile: dict[str, Any]) -> bool:
    """Only a run that runs something: a run check, or a validator that runs a program."""
    if profile.get("kind") in ("agent", "command"):
        return True
    return any(isinstance(a.get("check"), dict) and "run" in a["check"] for a in run.assertions)


@contextlib.contextmanager
def provided(run: Any, ctx: ValidationContext) -> Iterator[None]:
    """The run's environment built or reused, held for as long as the block judges, and
    given to its checks (`ctx.toolchain`, `ctx.environment`). Nothing without a declared
    environment, or on a replay (which runs nothing)."""
    spec = declared(run)
    if spec is None or ctx.replay is not None or not needed(run, ctx.profile):
        yield
        return
    source = run.mission.source()
    key = environment_key(spec, repository=f"{source.key}:{source.prefix}", checkout=ctx.checkout)
    outcome: dict[str, Any] = {}

    def build(folder: Path) -> bool:
        result = _build(spec, folder, ctx.checkout)
        outcome["result"] = result
        return result.ok

    with envcache.held(key, build) as entry:
        result = outcome.get("result")
        seconds = round(result.duration, 1) if result is not None else 0.0
        log = _log(result) if result is not None else ""
        broken_by = () if entry.ready else _changed_key_files(run, ctx, spec["key_files"])
        report = EnvironmentReport(key, entry.reused, seconds, entry.ready, log, broken_by)
        journal.append(run_id=run.pk, kind="note", key="environment", payload=_payload(spec, report, result))
        if not entry.ready and not broken_by:
            raise ValidatorCrashed(
                f"the environment {key[:12]} could not be built, and the revision did not change its key "
                "files since the base (a registry down, a broken setup, or no base to compare with; "
                f"docs/ENVIRONMENTS.md); its log ends:\n{log[-1500:]}",
                code="environment_failed",
            )
        ctx.environment = report
        if entry.ready:
            ctx.toolchain = toolchain(spec, entry.path)
        yield


def judged_with(
    env: EnvironmentReport, assertion: AssertionSpec, judged: Callable[[], AssertionVerdict]
) -> AssertionVerdict:
    """A run check's verdict with the run's environment: its line added to the evidence;
    failed with the build's log, without running, when the revision broke the build."""
    if env.ok:
        verdict = judged()
        return verdict.model_copy(update={"evidence": [*verdict.evidence, Evidence(kind="other", text=env.line())]})
    run = (assertion.check or {}).get("run")
    return AssertionVerdict(
        key=assertion.key,
        verdict="fail",
        message=bounded(f"check failed: {assertion.title} (the revision broke its environment's build)", 2000),
        expected=bounded(f"the environment {env.key[:12]} builds, then `{run}` runs", 2000),
        actual=bounded(f"its build failed after the revision changed {', '.join(env.broken_by)}", 2000),
        evidence=[Evidence(kind="test-output", text=escape_invisible(f"{env.line()}\n{_tail(env.log, 3500)}"))],
    )


def _payload(spec: dict[str, Any], report: EnvironmentReport, result: CommandResult | None) -> dict[str, Any]:
    return {
        "key": report.key,
        "preset": spec["preset"],
        "reused": report.reused,
        "ok": report.ok,
        "seconds": report.seconds,
        "broken_by": list(report.broken_by),
        "sandbox": result.sandbox if result is not None else "",
        "log": report.log,
    }


def toolchain(spec: dict[str, Any], folder: Path) -> Toolchain:
    """What the environment adds to a check, at the folder's own path (a virtualenv
    names it in its scripts): its bin folders first on PATH, the folder read-only, and
    for `node` its `node_modules` over the tree's."""
    env = {"FUSION_ENV": str(folder)}
    binds: tuple[Bind, ...] = ()
    if spec["preset"] == "python":
        env["VIRTUAL_ENV"] = str(folder / "venv")
    if spec["preset"] == "node":
        env["NODE_PATH"] = str(folder / "node_modules")  # where no sandbox mounts it over the tree
        binds = (Bind(folder / "node_modules", "node_modules"),)
    return Toolchain(path=_path(spec, folder), readable=(folder,), env=env, binds=binds)


def _path(spec: dict[str, Any], folder: Path) -> tuple[str, ...]:
    return tuple(str(folder / p) for p in spec["path"])


# ---------------------------------------------------------------- the key


def environment_key(spec: dict[str, Any], *, repository: str, checkout: Path) -> str:
    return sha256_of(
        {
            "recipe": RECIPE,
            "repository": repository,
            "preset": spec["preset"],
            "setup": spec["setup"],
            "key_files": spec["key_files"],
            "files": key_file_digests(checkout, spec["key_files"]),
            "platform": platform_facts(str(sandbox.check_interpreter()), spec["preset"]),
        }
    )[:32]


def key_file_digests(checkout: Path, patterns: list[str]) -> dict[str, str]:
    """{path: sha256} of the files of `checkout` that `patterns` name (a symlink by
    its target, never followed)."""
    rx = protect.compile_patterns(patterns)
    if rx is None:
        return {}
    found = {}
    for dirpath, dirs, files in os.walk(checkout):
        dirs.sort()
        for name in files:
            path = Path(dirpath, name)
            rel = path.relative_to(checkout).as_posix()
            if rx.match(rel):
                found[rel] = _digest(path)
    return dict(sorted(found.items()))


def _digest(path: Path) -> str:
    if path.is_symlink():
        return "symlink:" + os.readlink(path)
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


@functools.cache
def platform_facts(interpreter: str, preset: str) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "machine": platform.machine(),
        "system": platform.system(),
        "libc": list(platform.libc_ver()),
        "python": [os.path.realpath(interpreter), _version([interpreter, "-c", "import sys; print(sys.version)"])],
    }
    if preset == "node":
        facts["node"] = _version(["node", "--version"])
    return facts


def _version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=scrubbed_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    return (done.stdout or done.stderr).strip()[:300]


# ---------------------------------------------------------------- the build


def steps(spec: dict[str, Any], folder: Path, checkout: Path) -> list[str]:
    """The build's shell commands, each run from the tree in a shell of its own: the
    preset's own step, then `setup`, or the preset's default install without one."""
    preset, setup = spec["preset"], spec["setup"]
    own: list[str] = []
    default: list[str] = []
    if preset == "python":
        venv = folder / "venv"
        own = [f"{shlex.quote(str(sandbox.check_interpreter()))} -m venv {shlex.quote(str(venv))}"]
        if (checkout / "requirements.txt").is_file():
            python = shlex.quote(str(venv / "bin" / "python"))
            uv = shutil.which("uv", path=scrubbed_env()["PATH"])
            default = [
                f"uv pip install --python {python} -r requirements.txt"
                if uv
                else f"{python} -m pip install -r requirements.txt"
            ]
    elif preset == "node":
        default = ["npm ci"]
    return [*own, *(setup or default)]


def _build(spec: dict[str, Any], folder: Path, checkout: Path) -> CommandResult:
    commands = steps(spec, folder, checkout)
    script = "set -e\n" + "".join(f"printf '+ %s\\n' {shlex.quote(c)}\nsh -ec {shlex.quote(c)}\n" for c in commands)
    kept = {name: os.environ[name] for name in PASS_THROUGH if os.environ.get(name)}
    env = scrubbed_env({**kept, **QUIET[spec["preset"]], "FUSION_ENV": str(folder)}, path=_path(spec, folder))
    if spec["preset"] == "python":
        env["VIRTUAL_ENV"] = str(folder / "venv")
    node = spec["preset"] == "node"
    if node:
        (folder / "node_modules").mkdir()
    layered = sandbox.layers_work()
    with contextlib.ExitStack() as stack:
        # The build writes into a private layer over the snapshot, or else into a copy of it.
        tree = checkout if layered else stack.enter_context(private_copy(checkout))
        if node and not sandbox.status().confined:  # no mount over the tree: a link to the folder
            cleared = tree / "node_modules"
            if cleared.exists() or cleared.is_symlink():
                shutil.rmtree(cleared) if cleared.is_dir() and not cleared.is_symlink() else cleared.unlink()
            cleared.symlink_to(folder / "node_modules")
        confine = Confinement(
            tree=tree,
            layered=layered,
            writable=(folder,),
            network=True,
            limits=True,
            binds=(Bind(folder / "node_modules", "node_modules", writable=True),) if node else (),
        )
        try:
            return run_command(
                ["sh", "-c", script],
                cwd=tree,
                timeout=settings.FUSION_ENV_BUILD_TIMEOUT,
                max_output=LOG_BYTES,
                env=env,
                confine=confine,
            )
        except Unconfined as exc:  # never built unconfined when the sandbox is required
            raise ValidatorCrashed(str(exc), code="sandbox_unavailable") from exc
        except CommandError as exc:
            return CommandResult(exit_code=None, output=str(exc), timed_out=False, truncated=False, duration=0.0)


def _log(result: CommandResult) -> str:
    # Redacted before it is cut.
    head = "timed out and was killed" if result.timed_out else f"exit {result.exit_code}"
    return f"{head}\n{_tail(redact(URL_CREDENTIALS.sub('[REDACTED]@', result.output)), LOG_SHOWN)}"


def _tail(text: str, limit: int) -> str:
    # Its end, where a failed step says why.
    return text if len(text) <= limit else f"[… earlier output cut, last {limit} characters shown]\n" + text[-limit:]


def _changed_key_files(run: Any, ctx: ValidationContext, patterns: list[str]) -> tuple[str, ...]:
    """The key files the revision changed since the mission's base (not counting the
    protected ones protection put back); () without a base to compare with."""
    try:
        base = (run.protection or {}).get("base") or mission_base(run.mission)
        if not base:
            return ()
        compared = protect.Protection(base=base, source=run.mission.source(), revision=run.revision)
        changed = compared.diff().changed
    except SnapshotError:
        return ()
    restored = set(ctx.protection.changed)
    return tuple(p for p in changed if protect.matches(p, patterns) and p not in restored)
