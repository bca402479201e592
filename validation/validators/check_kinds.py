"""One assertion's check, by its kind (docs/MISSION_FILES.md): a file's content (`judge_file`),
a command's exit code and output (`judge_run`), a pytest run the witness watched
(`judge_witnessed`); `judge_assertion` picks by the spec. The `checks` validator
(`checks.py`) runs these for every assertion of a run, in isolation and protected.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.conf import settings

from fusion_site.runtime import sandbox
from fusion_site.runtime.proc import CommandError, Unconfined, run_command, scrubbed_env
from fusion_site.runtime.redact import bounded, redact
from fusion_site.runtime.sandbox import Confinement, Toolchain
from missions.checks_spec import MAX_TIMEOUT, check_spec_problems
from validation import witness
from validation.context import AssertionSpec, ValidatorCrashed
from validation.verdict import (
    AssertionVerdict,
    Evidence,
    EvidenceKind,
    Outcome,
    escape_invisible,
    file_ref,
    line_of,
    read_checkout_text,
)

NO_CHECK = "no check and no agent configured"
EVIDENCE_LIMIT = 4000  # what `bounded` keeps of one evidence text


def confined_path(root: Path, rel: str) -> Path | None:
    try:
        target = (root / rel).resolve()
    except (ValueError, OSError):  # e.g. an embedded NUL: refuse, never crash the run
        return None
    return target if target.is_relative_to(root.resolve()) else None


def judge_file(root: Path, spec: dict[str, Any]) -> tuple[Outcome, str, str, str]:
    """(verdict, expected, actual, evidence text) of a file check `check_spec_problems` accepts."""
    rel = spec["file"]
    target = confined_path(root, rel)
    if target is None:
        return (
            "fail",
            f"{rel} inside the checkout",
            "the path leaves the checkout; refused",
            f"{rel}: path escapes the checkout",
        )
    if "exists" in spec:
        exists, want = target.is_file(), spec["exists"] is True
        state = {True: "exists", False: "does not exist"}
        return "pass" if exists == want else "fail", f"{rel} {state[want]}", f"{rel} {state[exists]}", file_ref(rel)
    if not target.is_file():
        return "fail", f"{rel} exists", f"{rel} does not exist", file_ref(rel)
    text = read_checkout_text(target)
    wanted = "contains" in spec
    pattern = spec["contains"] if wanted else spec["not_contains"]
    expected = f"{rel} matches /{pattern}/" if wanted else f"{rel} has no match for /{pattern}/"
    match = re.search(pattern, text, re.M)
    if match is None:
        return "fail" if wanted else "pass", expected, "no match", file_ref(rel)
    line = line_of(text, match.start())
    actual = f"match at line {line}" if wanted else f"match at line {line}: {match.group(0)[:200]}"
    return "pass" if wanted else "fail", expected, actual, file_ref(rel, line)


def _output_tail(output: str, limit: int) -> str:
    # Cut from the front: the end of a failing run (a test summary, a traceback) explains it.
    text = redact(output)
    if len(text) <= limit:
        return text
    return f"[… output truncated, last {limit} characters shown]\n" + text[-limit:]


@dataclass(frozen=True)
class RunPlace:
    """Where and with what a run check runs: its tree (`layered`: the tree stays pristine
    and the check writes to a private layer, docs/SANDBOX.md), the environment's
    toolchain, and the host's folders it reads (`readable`) or writes (`writable`)."""

    root: Path
    layered: bool = False
    toolchain: Toolchain | None = None
    readable: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()

    def confinement(self, spec: dict[str, Any]) -> Confinement:
        tools = self.toolchain or Toolchain()
        return Confinement(
            tree=self.root,
            layered=self.layered,
            readable=(*tools.readable, *self.readable),
            writable=self.writable,
            network=spec.get("network", False) is True,
            binds=tools.binds,
        )

    def env(self, extra: dict[str, str] | None) -> dict[str, str]:
        tools = self.toolchain or Toolchain()
        return scrubbed_env({**tools.env, **(extra or {})}, path=tools.path)


def judge_run(
    place: RunPlace | Path, spec: dict[str, Any], env: dict[str, str] | None = None
) -> tuple[Outcome, str, str, str]:
    """`env`: added to the check's environment (the witness's)."""
    place = place if isinstance(place, RunPlace) else RunPlace(root=place)
    timeout = min(float(spec.get("timeout", settings.FUSION_CHECK_TIMEOUT)), MAX_TIMEOUT)
    expect_exit = spec.get("expect_exit", 0)
    pattern = spec.get("expect_output")
    try:
        # `expect_output` is a plain re.search over the whole output (no re.M): "RESULT: OK"
        # before a long log still counts. Only the evidence is the capped tail.
        result = run_command(
            spec["run"],
            cwd=place.root,
            timeout=timeout,
            max_output=settings.FUSION_CHECK_OUTPUT_BYTES,
            shell=spec.get("shell", False) is True,
            match=pattern,
            env=place.env(env),
            confine=place.confinement(spec),
        )
    except Unconfined as exc:  # never judged unconfined: the run ends `error` (docs/SANDBOX.md)
        raise ValidatorCrashed(str(exc), code="sandbox_unavailable") from exc
    except CommandError as exc:
        return "fail", run_expectation(spec), str(exc), str(exc)
    tail = _output_tail(result.output, min(settings.FUSION_CHECK_OUTPUT_BYTES, EVIDENCE_LIMIT - 500))
    if not result.ok and result.sandbox and (hint := sandbox.limit_hint(result.exit_code, result.output)):
        tail = f"{hint}\n{tail}"
    if result.timed_out:
        return (
            "fail",
            run_expectation(spec, within=timeout),
            f"timed out after {timeout:g}s and was killed",
            f"timed out after {timeout:g}s (killed)\n{tail}",
        )
    expected = run_expectation(spec)
    if result.exit_code != expect_exit:
        return "fail", expected, f"exit {result.exit_code}", f"exit {result.exit_code}\n{tail}"
    if pattern is not None and not result.matched:
        return "fail", expected, f"exit {result.exit_code}; output does not match", tail
    return "pass", expected, f"exit {result.exit_code}", f"exit {result.exit_code}\n{tail}"


def run_expectation(spec: dict[str, Any], *, within: float | None = None) -> str:
    """The whole of what a run check expects, whichever part failed: its exit code and,
    with `expect_output`, a match in its output (`re.search` over all of it); `within`:
    its time limit too, for a run that overran it."""
    parts = [f"finishes within {within:g}s"] if within is not None else []
    parts.append(f"exits {spec.get('expect_exit', 0)}")
    if spec.get("expect_output") is not None:
        parts.append(f"its output matches /{spec['expect_output']}/")
    return f"`{spec['run']}` " + (", ".join(parts[:-1]) + " and " if len(parts) > 1 else "") + parts[-1]


def shown(text: str, limit: int = 4000) -> str:
    # Escaped first, so the checks validator's own verdicts pass `no_invisible_characters`
    # (a "no BOM" check quotes a BOM) and the cut still bounds the escaped text.
    return bounded(escape_invisible(text), limit)


def assertion_verdict(
    key: str,
    verdict: Outcome,
    message: str,
    kind: EvidenceKind,
    evidence: str,
    expected: str = "",
    actual: str = "",
) -> AssertionVerdict:
    # A file reference is a path the check names, not output: redacting or cutting it
    # would make it name no file.
    text = escape_invisible(evidence) if kind == "file" else shown(evidence) or "(no output)"
    return AssertionVerdict(
        key=key,
        verdict=verdict,
        message=shown(message, 2000),
        expected=shown(expected, 2000),
        actual=shown(actual, 2000),
        evidence=[Evidence(kind=kind, text=text)],
    )


def judge_witnessed(place: RunPlace, spec: dict[str, Any], expected: witness.Expected) -> tuple[Outcome, str, str, str]:
    """`judge_run` of a pytest check, which passes only when the witness saw every
    protected test it expects pass (validation/witness.py). In the sandbox the check
    reads the plugin and writes only the reports file."""
    with witness.watching(place.root) as watch:
        watched = replace(
            place,
            readable=(*place.readable, watch.folder / "plugin"),
            writable=(*place.writable, watch.path),
        )
        verdict, wanted, actual, evidence = judge_run(watched, spec, watch.env())
        gap = witness.mismatch(expected, watch) if verdict == "pass" else None
    if gap is None:
        return verdict, wanted, actual, evidence
    wanted, actual = gap
    return "fail", wanted, actual, f"{actual}\n{evidence}"


def judge_assertion(
    root: Path | RunPlace, assertion: AssertionSpec, *, expected: witness.Expected | None = None
) -> AssertionVerdict:
    """`expected`: what the witness expects of a pytest check (`witness.plan`)."""
    place = root if isinstance(root, RunPlace) else RunPlace(root=root)
    root = place.root
    spec = assertion.check
    problems = check_spec_problems(spec)
    if problems:  # never guess what a check means: a human fixes it
        return assertion_verdict(
            assertion.key,
            "blocked",
            "the check is not understood: " + "; ".join(problems),
            "other",
            f"{assertion.key}: check {json.dumps(spec, ensure_ascii=False, default=str)}",
        )
    assert spec is not None  # check_spec_problems has a problem for anything but an object
    kind: EvidenceKind
    if "run" in spec:
        verdict, wanted, actual, evidence = (
            judge_run(place, spec) if expected is None else judge_witnessed(place, spec, expected)
        )
        kind = "test-output"
    else:
        verdict, wanted, actual, evidence = judge_file(root, spec)
        target = confined_path(root, spec["file"])
        # A `file` evidence must name a file that exists in the checkout.
        kind = "file" if target is not None and target.is_file() else "other"
    message = f"check {'passed' if verdict == 'pass' else 'failed'}: {assertion.title}"
    return assertion_verdict(assertion.key, verdict, message, kind, evidence, wanted, actual)
