"""Hypothesis: a malformed or incomplete verdict document is never accepted as a pass,
whichever way it reaches the host (a model's structured output or a command's stdout)."""

from __future__ import annotations

import json
import unicodedata

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from validation.validators.command import read_stdout
from validation.validators.repair import assess
from validation.verdict import FrozenContext, normalize

KEYS = ("VAL-1", "VAL-2", "VAL-3")
FROZEN = FrozenContext(keys=KEYS)
VERDICTS = ("pass", "fail", "blocked")

text = st.text(max_size=30)
evidence = st.fixed_dictionaries(
    {"kind": st.sampled_from(["file", "command", "test-output", "other", "code"]), "text": text}
)
assertion = st.fixed_dictionaries(
    {
        "key": st.one_of(st.sampled_from(KEYS + ("VAL-9", "", "val-1")), text),
        "verdict": st.one_of(st.sampled_from(VERDICTS + ("PASS", "ok")), st.none()),
    },
    optional={
        "message": st.one_of(text, st.integers()),
        "expected": text,
        "actual": text,
        "evidence": st.lists(evidence, max_size=3),
        "extra": text,
    },
)
document = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(VERDICTS + ("", "PASS")),
        "summary": text,
        "blocked_reason": text,
        "assertions": st.lists(assertion, max_size=5),
        "confidence": st.floats(),
    },
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)


def complete_pass(doc) -> bool:
    """The independent oracle: what a pass must look like, written without the host's code."""
    if not isinstance(doc, dict) or set(doc) - {"status", "summary", "blocked_reason", "assertions"}:
        return False
    if doc.get("status") not in VERDICTS or not isinstance(doc.get("assertions"), list):
        return False
    items = doc["assertions"]
    if sorted(i.get("key") for i in items if isinstance(i, dict)) != sorted(KEYS) or len(items) != len(KEYS):
        return False
    for i in items:
        if set(i) - {"key", "verdict", "message", "expected", "actual", "evidence"} or i.get("verdict") != "pass":
            return False
        if not all(isinstance(i.get(f, ""), str) for f in ("message", "expected", "actual")):
            return False
        ev = i.get("evidence", [])
        if not any(e["text"].strip() for e in ev) or any(
            e["kind"] not in ("file", "command", "test-output", "other") for e in ev
        ):
            return False
        if any(unicodedata.category(c) in ("Cf", "Co", "Cs") for e in ev for c in e["text"]):
            return False
    return True


def accepted_as_pass(candidate) -> bool:
    verdict, _stage, failed = assess(candidate, FROZEN)
    return verdict is not None and not failed and normalize(verdict).status == "pass"


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(document)
def test_generated_documents_pass_only_when_complete(doc):
    if accepted_as_pass(doc):
        assert complete_pass(doc), doc


def _mutations():
    good = {
        "status": "pass",
        "summary": "ok",
        "assertions": [
            {"key": k, "verdict": "pass", "message": "m", "evidence": [{"kind": "other", "text": "seen"}]} for k in KEYS
        ],
    }
    drop_item = st.integers(0, 2).map(
        lambda i: {**good, "assertions": good["assertions"][:i] + good["assertions"][i + 1 :]}
    )
    duplicate = st.integers(0, 2).map(lambda i: {**good, "assertions": good["assertions"] + [good["assertions"][i]]})
    no_evidence = st.integers(0, 2).map(
        lambda i: {
            **good,
            "assertions": [{**a, "evidence": []} if j == i else a for j, a in enumerate(good["assertions"])],
        }
    )
    partial = st.integers(0, 2).map(
        lambda i: {
            **good,
            "assertions": [{**a, "verdict": "fail"} if j == i else a for j, a in enumerate(good["assertions"])],
        }
    )
    drop_field = st.sampled_from(["status", "assertions"]).map(lambda f: {k: v for k, v in good.items() if k != f})
    invisible = st.sampled_from(["\u200b", "\u202e", "\ufeff"]).map(
        lambda ch: {
            **good,
            "assertions": [{**good["assertions"][0], "evidence": [{"kind": "other", "text": "seen" + ch}]}]
            + good["assertions"][1:],
        }
    )
    return st.one_of(drop_item, duplicate, no_evidence, partial, drop_field, invisible)


@settings(max_examples=200)
@given(_mutations())
def test_broken_variants_of_a_good_verdict_never_pass(doc):
    assert not accepted_as_pass(doc)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(json_values, document), st.sampled_from(["raw", "fenced", "prose", "two-fences", "truncated"]))
def test_command_stdout_never_smuggles_a_pass(value, wrapping):
    body = json.dumps(value)
    stdout = {
        "raw": body,
        "fenced": f"Verdict:\n```json\n{body}\n```\n",
        "prose": f"I think: {body}",
        "two-fences": f"```json\n{body}\n```\n```json\n{body}\n```",
        "truncated": body[: max(len(body) - 1, 0)],
    }[wrapping]
    candidate, _parse = read_stdout(stdout)
    if accepted_as_pass(candidate):
        assert complete_pass(candidate) and wrapping in ("raw", "fenced")


def test_the_oracle_and_the_host_agree_on_a_good_verdict():
    good = {
        "status": "pass",
        "summary": "ok",
        "assertions": [
            {"key": k, "verdict": "pass", "message": "m", "evidence": [{"kind": "other", "text": "seen"}]} for k in KEYS
        ],
    }
    assert complete_pass(good) and accepted_as_pass(good)  # the properties above are not vacuous
    assert accepted_as_pass(read_stdout("```json\n" + json.dumps(good) + "\n```")[0])
