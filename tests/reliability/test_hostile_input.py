"""Hostile input.

- schemathesis against /api/schema/ through the Django WSGI application, for every
  operation and method, as a member of the mission and as a stranger, in positive and
  negative generation modes: no 5xx, no response that breaks its own schema, every
  refusal a JSON error with a `code`, and no write by the stranger to the member's
  mission (its rows compared before and after each request). The number of generated
  requests is `FUSION_FUZZ_REQUESTS` (default: 1,000 on PostgreSQL, 240 embedded); the
  count actually sent is printed and asserted.
- hypothesis on the verdict contract: parse_candidate + run_host_validators + normalize
  never accept an invalid document as a pass, and on the review accounting validator.
- oversized bodies (> FUSION_MAX_BODY_BYTES) and oversized mission files are refused
  with 413/400 and a JSON error code, and change nothing.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import time
from collections import Counter

import pytest
from django.conf import settings
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, seed
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.conftest import is_postgres
from tests.reliability.conftest import mission_rows, token_of

pytestmark = pytest.mark.django_db

FUZZ_REQUESTS = int(os.environ.get("FUSION_FUZZ_REQUESTS") or (1000 if is_postgres() else 240))
RESOURCE_OBJECT = {
    "missions": "mission",
    "milestones": "m1",
    "slices": "s1",
    "features": "f1",
    "assertions": "a1",
    "tasks": "t2",
    "events": "event",
    "validation-runs": "r1",
    "lineage": "lineage",
    "reviews": "review",
}


@contextlib.contextmanager
def wsgi_in_test_transaction():
    """The WSGI handler closes 'old' connections around each request, which would end the
    test's transaction; Django's own test client disconnects the same receivers."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def load_schema(token: str):
    import schemathesis
    from django.core.wsgi import get_wsgi_application

    app = get_wsgi_application()
    return schemathesis.openapi.from_wsgi("/api/schema/", app, headers={"Authorization": f"Token {token}"})


def json_error_check(ctx, response, case):
    """Every refusal is JSON with a stable `code` (docs/API.md)."""
    if 400 <= response.status_code < 500 and response.status_code != 405:
        try:
            body = response.json()
        except Exception:  # noqa: BLE001
            raise AssertionError(f"{response.status_code} without a JSON body: {response.content[:200]!r}") from None
        assert isinstance(body, dict) and isinstance(body.get("code"), str) and body["code"], body


def _path_object(world, path: str):
    segment = path.strip("/").split("/")[1]
    name = RESOURCE_OBJECT.get(segment)
    return getattr(world, name) if name else None


def fuzz(world, user, *, requests: int, stranger: bool) -> tuple[Counter, list[str]]:
    """Send about `requests` generated requests spread over every operation; returns
    (status counts, failures)."""
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import response_schema_conformance

    token = token_of(user)
    headers = {"Authorization": f"Token {token}"}
    schema = load_schema(token)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 40, [op.label for op in operations]
    modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    per_case = max(1, math.ceil(requests / (len(operations) * len(modes) * 2)))
    statuses: Counter = Counter()
    failures: list[str] = []
    sent = 0
    baseline = mission_rows(world.mission.pk) if stranger else None
    checks = [not_a_server_error, response_schema_conformance, json_error_check]

    def exercise(case):
        nonlocal sent
        response = case.call(headers=headers)
        sent += 1
        statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=checks, headers=headers)
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 — collected, reported together at the end
            failures.append(
                f"{case.operation.label} -> {response.status_code}: {str(exc)[:600]}\n"
                f"  body: {response.content[:300]!r}"
            )
        if stranger:
            after = mission_rows(world.mission.pk)
            if after != baseline:
                failures.append(
                    f"{case.operation.label}: the stranger wrote to the member's mission ({response.status_code})"
                )

    round_no = 0
    while sent < requests and round_no < 6:
        for op in operations:
            obj = _path_object(world, op.path)
            for mode in modes:
                for fixed in (True, False):
                    kwargs = {}
                    if fixed and obj is not None and "{id}" in op.path and mode == GenerationMode.POSITIVE:
                        kwargs["path_parameters"] = {"id": obj.pk}
                    strategy = op.as_strategy(generation_mode=mode, **kwargs)

                    @seed(round_no * 1000 + len(failures))
                    @hsettings(
                        max_examples=per_case,
                        deadline=None,
                        database=None,
                        derandomize=False,
                        phases=[Phase.explicit, Phase.generate],
                        suppress_health_check=list(HealthCheck),
                    )
                    @given(case=strategy)
                    def run(case):
                        exercise(case)

                    run()
        round_no += 1
    return statuses, failures, sent


@pytest.mark.slow
@pytest.mark.parametrize("as_stranger", [False, True], ids=["member", "stranger"])
def test_schemathesis_against_the_openapi_schema(as_stranger, users, world, capsys):
    """Half of the budget as the member, half as the stranger (against the member's ids)."""
    budget = math.ceil(FUZZ_REQUESTS / 2)
    user = users.stranger if as_stranger else users.member
    started = time.monotonic()
    with wsgi_in_test_transaction():
        statuses, failures, sent = fuzz(world, user, requests=budget, stranger=as_stranger)
    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(
            f"\n[fuzz] {'stranger' if as_stranger else 'member'}: {sent} requests in {elapsed:.1f}s on "
            f"{'PostgreSQL' if is_postgres() else 'SQLite'}; statuses {dict(sorted(statuses.items()))}; "
            f"failures {len(failures)}"
        )
    assert not failures, "\n".join(failures[:15])
    assert sent >= budget
    assert not any(code >= 500 for code in statuses)
    if as_stranger:
        # the stranger reached the member's objects only as "missing"
        assert statuses[200] + statuses[201] + statuses[202] + statuses[204] > 0  # their own lists and creates
        assert statuses[404] > 0


# ============================================================ the verdict contract

KEYS = ("VAL-1", "VAL-2", "VAL-3")
texts = st.text(max_size=40)
evidence = st.fixed_dictionaries(
    {"kind": st.sampled_from(["file", "command", "test-output", "other", "bogus"]), "text": texts}
)
item = st.fixed_dictionaries(
    {
        "key": st.sampled_from(KEYS + ("VAL-X", "")),
        "verdict": st.sampled_from(["pass", "fail", "blocked", "PASS", "ok"]),
    },
    optional={
        "message": texts,
        "expected": texts,
        "actual": texts,
        "evidence": st.lists(evidence, max_size=3),
        "extra": texts,
    },
)
documents = st.one_of(
    st.fixed_dictionaries(
        {
            "status": st.sampled_from(["pass", "fail", "blocked", "PASS", "done"]),
            "assertions": st.lists(item, max_size=5),
        },
        optional={"summary": texts, "blocked_reason": texts, "extra": texts},
    ),
    st.recursive(
        st.none() | st.booleans() | st.integers() | texts,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
        max_leaves=8,
    ),
)


def _valid_pass(document, keys) -> bool:
    """The contract, restated independently: a document may end as a pass only if it is
    exactly the closed shape and judges every key once, every item a pass with evidence."""
    if not isinstance(document, dict) or set(document) - {"status", "summary", "blocked_reason", "assertions"}:
        return False
    items = document.get("assertions")
    if not isinstance(items, list) or sorted(i.get("key") for i in items if isinstance(i, dict)) != sorted(keys):
        return False
    for i in items:
        if set(i) - {"key", "verdict", "message", "expected", "actual", "evidence"} or i.get("verdict") != "pass":
            return False
        ev = i.get("evidence") or []
        if not ev or not any(isinstance(e, dict) and str(e.get("text", "")).strip() for e in ev):
            return False
        if any(e.get("kind") not in ("file", "command", "test-output", "other") for e in ev):
            return False
    return document.get("status") in ("pass", "fail", "blocked")


@hsettings(
    max_examples=int(os.environ.get("FUSION_HYPOTHESIS_EXAMPLES", "600")),
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(document=documents, keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
def test_the_verdict_contract_never_accepts_an_invalid_document_as_a_pass(document, keys):
    from validation.verdict import FrozenContext, normalize, parse_candidate, run_host_validators

    verdict, problems = parse_candidate(document)
    if verdict is None:
        assert problems
        return
    report = run_host_validators(verdict, FrozenContext(keys=tuple(keys), checkout=None))
    if not report.ok:
        return
    final = normalize(verdict)
    if final.status == "pass":
        assert _valid_pass(document, keys), document
        assert all(a.verdict == "pass" for a in final.assertions)
        assert sorted(a.key for a in final.assertions) == sorted(keys)
    else:
        assert any(a.verdict != "pass" for a in final.assertions)


@hsettings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    statuses=st.lists(st.sampled_from(["pass", "fail", "blocked"]), min_size=1, max_size=4),
    claimed=st.sampled_from(["pass", "fail", "blocked"]),
)
def test_the_overall_status_is_recomputed_whatever_the_document_claims(statuses, claimed):
    from validation.verdict import normalize, parse_candidate

    doc = {
        "status": claimed,
        "assertions": [
            {
                "key": f"K{i}",
                "verdict": v,
                "message": "m",
                "expected": "e",
                "actual": "a",
                "evidence": [{"kind": "other", "text": "t"}],
            }
            for i, v in enumerate(statuses)
        ],
    }
    verdict, _ = parse_candidate(doc)
    final = normalize(verdict)
    expected = "blocked" if "blocked" in statuses else "fail" if "fail" in statuses else "pass"
    assert final.status == expected


# ============================================================ the review accounting


def _host_findings():
    from validation.review.candidates import source_findings

    def f(summary, severity, location):
        return {"severity": severity, "location": location, "evidence": "seen", "impact": "users", "summary": summary}

    return source_findings(
        {
            "A": {"findings": [f("wrong word", "high", "app.py:1")]},
            "B": {"findings": [f("wrong greeting", "critical", "app.py:1"), f("no test", "minor", "tests/")]},
            "C": {"findings": []},
        }
    )


def _mutate(data, doc: dict) -> str:
    """One random breach of the accounting: drop, duplicate, change or invent an entry of
    findings / decisions / groups, or change one of an entry's fields."""
    acc = doc["validation_accounting"]
    name = data.draw(st.sampled_from([k for k in ("findings", "decisions", "groups") if acc[k]]))
    entries = acc[name]
    index = data.draw(st.integers(0, len(entries) - 1))
    how = data.draw(st.sampled_from(["drop", "duplicate", "field", "invent", "drop_field"]))
    entry = entries[index]
    if how == "drop":
        entries.pop(index)
    elif how == "duplicate":
        entries.append(copy.deepcopy(entry))
    elif how == "invent":
        clone = copy.deepcopy(entry)
        for k in ("source_id", "group_id"):
            if k in clone:
                clone[k] = "Z-F999" if k == "source_id" else "G-invented"
        entries.append(clone)
    else:
        field = data.draw(st.sampled_from(sorted(entry)))
        if how == "drop_field":
            del entry[field]
        else:
            entry[field] = data.draw(
                st.sampled_from(["", "   ", "zz-invented", 12345, None, ["x"], "exclude", "include"])
            )
    return f"{how} {name}[{index}]"


@hsettings(
    max_examples=int(os.environ.get("FUSION_HYPOTHESIS_EXAMPLES", "600")) // 2,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data(), exclude_b2=st.booleans())
def test_the_review_accounting_never_accepts_an_invalid_accounting(data, exclude_b2):
    """A valid evaluation (every host finding copied exactly and accounted for once) is
    accepted; any single breach hypothesis makes of it is refused with a reason, unless
    the mutation happens to leave the accounting semantically identical (checked)."""
    from tests.review.support import good_evaluation
    from validation.review.accounting import check_evaluation
    from validation.review.candidates import LABELS

    host = _host_findings()
    blind = {"validation_source_findings": host, "candidates": [{"candidate_id": label} for label in LABELS]}
    valid = good_evaluation(blind, exclude=lambda f: exclude_b2 and f["source_id"] == "B-F002")
    assert check_evaluation(valid, host) == []
    doc = copy.deepcopy(valid)
    what = _mutate(data, doc)
    if doc == valid:
        return
    problems = check_evaluation(doc, host)
    if problems:
        return
    # Accepted: it must still be an exact accounting (e.g. a rationale changed to another
    # non-blank text, or a decision field that a valid document may carry either way).
    acc = doc["validation_accounting"]
    assert acc["findings"] == host, what
    decided = [d["source_id"] for d in acc["decisions"]]
    assert sorted(decided) == sorted(f["source_id"] for f in host), what
    grouped = sorted(sid for g in acc["groups"] for sid in g["source_ids"])
    included = sorted(d["source_id"] for d in acc["decisions"] if d["decision"] == "include")
    assert grouped == included, what


@pytest.mark.parametrize("where", ["findings", "decisions", "groups"])
@pytest.mark.parametrize("bad", [["x"], {"id": 1}], ids=["list", "object"])
def test_the_review_accounting_refuses_a_non_string_id_instead_of_crashing(where, bad):
    """An evaluator that answers a JSON array or object where an id string belongs must get
    a repair reason, not crash the host validator (found by the property test above)."""
    from tests.review.support import good_evaluation
    from validation.review.accounting import check_evaluation
    from validation.review.candidates import LABELS

    host = _host_findings()
    doc = good_evaluation({"validation_source_findings": host, "candidates": [{"candidate_id": x} for x in LABELS]})
    entry = doc["validation_accounting"][where][0]
    entry["group_id" if where == "groups" else "source_id"] = bad
    problems = check_evaluation(doc, host)
    assert problems and all(isinstance(p, str) for p in problems)


# ====================================================================== oversized input


def _limit() -> int:
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


@pytest.mark.parametrize("url", ["/api/missions/", "/api/missions/import/", "/api/reviews/", "/api/tasks/"])
def test_a_body_over_the_limit_is_refused_with_a_json_code(url, users, world, client):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(users.member)
    before = mission_rows(world.mission.pk)
    huge = '{"key": "big", "title": "' + "x" * (_limit() + 1024) + '"}'
    response = api.post(url, huge, content_type="application/json")
    assert response.status_code in (400, 413), (response.status_code, response.content[:300])
    body = response.json()
    assert body["code"] in (
        "request_too_large",
        "payload_too_large",
        "too_large",
        "parse_error",
        "invalid_mission_file",
    ), body
    assert mission_rows(world.mission.pk) == before


def test_an_oversized_mission_file_is_refused(users, world):
    from rest_framework.test import APIClient

    from missions.errors import Invalid
    from missions.services import files

    api = APIClient()
    api.force_authenticate(users.staff)
    before = mission_rows(world.mission.pk)
    padding = "# " + "y" * 200 + "\n"
    text = f"mission: {{key: {world.mission.key}, title: Big}}\n" + padding * (
        (files.MAX_DOCUMENT_CHARS // len(padding)) + 2
    )
    with pytest.raises(Invalid) as info:
        files.mission_import(document=text, user=users.staff)
    assert info.value.code == "invalid_mission_file" and "too large" in str(info.value.fields)
    # through the API the body limit answers first
    response = api.post("/api/missions/import/", text, content_type="application/yaml")
    assert response.status_code in (400, 413) and response.json()["code"]
    assert mission_rows(world.mission.pk) == before


def test_an_oversized_mission_file_on_the_command_line_is_refused(world, tmp_path):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from missions.services import files

    before = mission_rows(world.mission.pk)
    path = tmp_path / "big.yaml"
    with open(path, "w") as fh:
        fh.write(f"mission: {{key: {world.mission.key}, title: Big}}\n")
        fh.write(("# " + "z" * 500 + "\n") * (files.MAX_DOCUMENT_CHARS // 500 + 10))
    with pytest.raises(CommandError), open(tmp_path / "out", "w") as out:
        call_command("import_mission", str(path), stdout=out, stderr=out)
    assert mission_rows(world.mission.pk) == before
