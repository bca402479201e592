"""A check's pass means exactly what it says: every writer refuses a check it cannot
read, the judge blocks one it does not understand, the checks validator's own verdicts
always satisfy the host validators, and `expect_output` sees the whole output."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion_site.repos.snapshots import snapshot
from fusion_site.runtime.proc import run_command
from missions.checks_spec import check_spec_problems
from missions.errors import Invalid
from missions.models import ContractAssertion, Milestone, Mission, MissionFeature
from missions.services import hierarchy
from validation.context import AssertionSpec
from validation.models import RunStatus, ValidatorRun
from validation.services.runner import execute_run
from validation.services.verdicts.admit import feature_admit
from validation.validators.check_kinds import judge_assertion
from validation.verdict import (
    FrozenContext,
    Verdict,
    file_ref,
    line_count,
    line_of,
    normalize,
    read_checkout_text,
    run_host_validators,
)

BAD_CHECKS = [
    {"file": "a", "exists": "false"},
    {"file": "a", "contains": "x", "not_contains": "y"},
    {"file": "a", "exists": True, "mode": "strict"},
]


def _spec(check, key: str = "VAL-1") -> AssertionSpec:
    return AssertionSpec(key=key, title=f"{key} holds", statement=key, check=check)


def host_problems(root: Path, verdicts) -> dict[str, list[str]]:
    """What the host validators say about the checks validator's own verdicts."""
    document = normalize(Verdict(status="pass", assertions=list(verdicts)))
    return run_host_validators(document, FrozenContext(keys=tuple(v.key for v in verdicts), checkout=root)).problems


def validate_at_head(build_mission, features) -> tuple[str, ValidatorRun]:
    build_mission(features)
    feature = MissionFeature.objects.get(key=next(iter(features)))
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    status = execute_run(run.pk)
    return status, ValidatorRun.objects.get(pk=run.pk)


# --- 1. one shape rule for every writer ---------------------------------------------------


@pytest.fixture
def milestone(db, admin_user) -> Milestone:
    mission = Mission.objects.create(key="m", title="M", owner=admin_user)
    return Milestone.objects.create(mission=mission, key="ms", title="MS")


def _admin_post(client, path: str, milestone: Milestone, check) -> object:
    return client.post(
        path,
        {
            "milestone": milestone.pk,
            "key": "VAL-A",
            "title": "a",
            "statement": "s",
            "scope": "feature",
            "order": "0",
            "check_spec": json.dumps(check),
            "feature_links-TOTAL_FORMS": "0",
            "feature_links-INITIAL_FORMS": "0",
        },
    )


@pytest.mark.parametrize("check", BAD_CHECKS)
def test_the_admin_add_and_change_forms_refuse_a_check_the_judge_cannot_read(admin_client, milestone, check):
    added = _admin_post(admin_client, reverse("admin:missions_contractassertion_add"), milestone, check)
    assert added.status_code == 200 and "check_spec" in added.context["adminform"].form.errors
    assert not ContractAssertion.objects.exists()

    assertion = ContractAssertion(
        milestone=milestone, key="VAL-A", title="a", statement="s", check_spec={"file": "a", "exists": True}
    )
    assertion.save()
    changed = _admin_post(
        admin_client, reverse("admin:missions_contractassertion_change", args=[assertion.pk]), milestone, check
    )
    assert changed.status_code == 200 and "check_spec" in changed.context["adminform"].form.errors
    assert ContractAssertion.objects.get(pk=assertion.pk).check_spec == {"file": "a", "exists": True}


@pytest.mark.parametrize("check", BAD_CHECKS)
def test_the_services_refuse_a_check_the_judge_cannot_read(admin_user, milestone, check):
    with pytest.raises(Invalid) as refused:
        hierarchy.assertion_create(
            user=admin_user, milestone=milestone, key="VAL-A", title="a", statement="s", check_spec=check
        )
    assert refused.value.code == "invalid_check" and refused.value.fields["check"] == check_spec_problems(check)
    assert not ContractAssertion.objects.exists()

    assertion = hierarchy.assertion_create(
        user=admin_user,
        milestone=milestone,
        key="VAL-A",
        title="a",
        statement="s",
        check_spec={"file": "a", "exists": True},
    )
    with pytest.raises(Invalid) as refused:
        hierarchy.assertion_update(user=admin_user, assertion=assertion, title="changed", check_spec=check)
    assert refused.value.code == "invalid_check" and refused.value.fields["check"]
    assert ContractAssertion.objects.get(pk=assertion.pk).title == "a"


def test_the_services_still_accept_good_checks_and_no_check(admin_user, milestone):
    good = hierarchy.assertion_create(
        user=admin_user,
        milestone=milestone,
        key="VAL-A",
        title="a",
        statement="s",
        check_spec={"run": "pytest -q", "protect": ["tests/**"]},
    )
    hierarchy.assertion_update(user=admin_user, assertion=good, check_spec=None)
    hierarchy.assertion_update(user=admin_user, assertion=good, title="retitled")
    assert ContractAssertion.objects.get(pk=good.pk).check_spec is None


def test_the_api_still_refuses_a_bad_check_as_a_field_error(api_for, staff, milestone):
    response = api_for(staff).post(
        "/api/assertions/",
        {"milestone": milestone.pk, "key": "VAL-A", "title": "a", "statement": "s", "check": BAD_CHECKS[0]},
        format="json",
    )
    assert response.status_code == 400 and "check" in response.json()["fields"]


@pytest.mark.parametrize(
    "spec",
    [
        {"run": "pytest -q", "protect": ["tests/**", "conftest.py"]},
        {"file": "a.txt", "exists": True, "protect": []},
        {"file": "a.txt", "contains": "x", "protect": ["src/*.py"]},
    ],
)
def test_protect_is_a_list_of_relative_globs(spec):
    assert check_spec_problems(spec) == []


@pytest.mark.parametrize(
    "protect", ["tests/**", ["tests/**", ""], ["  "], [3], ["/etc/*"], ["a/../../b"], ["a\x00"], {"tests": True}, None]
)
def test_protect_refuses_anything_else(protect):
    for spec in ({"run": "pytest", "protect": protect}, {"file": "a", "exists": True, "protect": protect}):
        problems = check_spec_problems(spec)
        assert problems and all("protect" in p for p in problems), (spec, problems)


# --- 2. the judge blocks what it does not understand -----------------------------------------


@pytest.mark.parametrize(
    "check",
    [*BAD_CHECKS, {"run": "true", "expect_exit": "0"}, {"run": "true", "shell": "no"}, {"nothing": 1}, None, "true"],
)
def test_the_judge_blocks_a_check_it_does_not_understand(tmp_path, check):
    verdict = judge_assertion(tmp_path, _spec(check))
    assert verdict.verdict == "blocked", verdict
    assert verdict.message.startswith("the check is not understood: ")
    assert verdict.evidence[0].kind == "other" and verdict.evidence[0].text
    assert not host_problems(tmp_path, [verdict])


@pytest.mark.django_db(transaction=True)
def test_a_stored_exists_false_string_blocks_the_run_instead_of_passing(idle_broker, build_mission):
    # saved directly, past every writer: only the judge stands between it and a pass
    status, run = validate_at_head(build_mission, {"f": [("VAL-1", {"file": "missing.txt", "exists": "false"})]})
    assert status == RunStatus.BLOCKED, run.error
    [item] = run.verdict["assertions"]
    assert item["verdict"] == "blocked" and "exists must be true or false" in item["message"]


# --- 3. the checks validator's verdicts are well-formed by construction ----------------------

HOSTILE_FILES: dict[str, bytes] = {
    "dir with space/my file.txt": b"hello\nRESULT: OK\n",
    "a:b.txt": b"colon in the name\n",
    'q"uo\\te.txt': b"quote and backslash\n",
    "zero\u200bwidth.txt": b"named with a zero-width space\n",
    "bom.txt": "\ufeffhello\n".encode(),
    "zw.txt": "a\u200bb\n".encode(),
    "cr.txt": b"one\rtwo\rthree",
    "crlf.txt": b"one\r\ntwo\r\nthree\r\n",
    "latin1.bin": b"caf\xe9\nline2\n\xff\xfe end",
    "long.txt": b"x" * 300_000 + b"\nneedle",
}
PRINT_INVISIBLE = (
    "python -c \"import sys; print('zero\\u200bwidth \\ufeff bom'); sys.stdout.flush(); "
    "sys.stdout.buffer.write(b'\\xff\\xfe raw')\""
)  # invisible characters and non-UTF-8 bytes

PASSING = {
    **{f"VAL-E{i}": {"file": path, "exists": True} for i, path in enumerate(HOSTILE_FILES)},
    "VAL-N1": {"file": "missing file: gone.txt", "exists": False},
    "VAL-C1": {"file": "dir with space/my file.txt", "contains": "^RESULT: OK$"},
    "VAL-C2": {"file": "cr.txt", "contains": "three"},
    "VAL-C3": {"file": "crlf.txt", "contains": "three"},
    "VAL-C4": {"file": "crlf.txt", "contains": r"\n"},
    "VAL-C5": {"file": "crlf.txt", "contains": r"\Z"},
    "VAL-C6": {"file": "bom.txt", "contains": "\ufeff"},
    "VAL-C7": {"file": "zw.txt", "contains": "\u200b"},
    "VAL-C8": {"file": "latin1.bin", "contains": "end$"},
    "VAL-C9": {"file": "long.txt", "contains": "needle"},
    "VAL-C10": {"file": "a:b.txt", "contains": "colon"},
    "VAL-C11": {"file": 'q"uo\\te.txt', "contains": "backslash"},
    "VAL-C12": {"file": "zero\u200bwidth.txt", "contains": "zero-width"},
    "VAL-X1": {"file": "a:b.txt", "not_contains": "\ufeff"},
    "VAL-R1": {"run": PRINT_INVISIBLE, "expect_output": "\u200bwidth"},
    "VAL-R2": {"run": "cat 'dir with space/my file.txt'", "expect_output": "RESULT: OK"},
}
FAILING = {
    "VAL-F1": {"file": "bom.txt", "not_contains": "\ufeff"},
    "VAL-F2": {"file": "crlf.txt", "not_contains": "\r"},
    "VAL-F3": {"file": "cr.txt", "not_contains": "three"},
    "VAL-F4": {"file": "long.txt", "not_contains": "needle"},
    "VAL-F5": {"file": "zero\u200bwidth.txt", "not_contains": "zero"},
    "VAL-F6": {"file": "dir with space/my file.txt", "contains": "absent"},
    "VAL-F7": {"file": "missing\u200b.txt", "contains": "x"},
    "VAL-F8": {"file": "a:b.txt", "exists": False},
    "VAL-F9": {"run": PRINT_INVISIBLE, "expect_output": "never printed"},
}


@pytest.fixture
def hostile_rev(git_repo) -> str:
    for rel, data in HOSTILE_FILES.items():
        target = git_repo.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return git_repo.commit({}, "hostile but legitimate content")


def test_every_check_kind_on_hostile_content_yields_verdicts_the_host_accepts(git_repo, hostile_rev):
    with snapshot(str(git_repo.path), hostile_rev) as root:
        verdicts = [judge_assertion(root, _spec(check, key)) for key, check in {**PASSING, **FAILING}.items()]
        assert not host_problems(root, verdicts)
    outcome = {v.key: v.verdict for v in verdicts}
    assert outcome == {**dict.fromkeys(PASSING, "pass"), **dict.fromkeys(FAILING, "fail")}
    by_key = {v.key: v for v in verdicts}
    assert by_key["VAL-C2"].evidence[0].text == "cr.txt:3"  # bare CR ends a line, as the host counts it
    assert by_key["VAL-C5"].evidence[0].text == "crlf.txt:3"
    assert by_key["VAL-C1"].evidence[0].text == '"dir with space/my file.txt":2'
    assert "\\ufeff" in by_key["VAL-F1"].expected and "\\ufeff" in by_key["VAL-F1"].actual


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("checks, expected", [(PASSING, RunStatus.PASSED), ({**PASSING, **FAILING}, RunStatus.FAILED)])
def test_a_full_run_on_hostile_content_ends_passed_or_failed_never_error(
    idle_broker, build_mission, hostile_rev, checks, expected
):
    status, run = validate_at_head(build_mission, {"f": list(checks.items())})
    assert status == expected, run.error


def test_quoted_file_evidence_reads_back_and_plain_forms_still_work(tmp_path):
    for rel in ("plain.txt", "my file.txt", "a:b.txt", 'q"x.txt', "z\u200bw.txt", "\ufeffbom.txt"):
        (tmp_path / rel).write_text("one\ntwo\n")
        assert not host_problems(tmp_path, [_file_verdict(file_ref(rel, 2))]), rel
        assert host_problems(tmp_path, [_file_verdict(file_ref(rel, 3))]), rel
    for text in ("plain.txt", "plain.txt:2", "plain.txt:1 the first line", "plain.txt: somewhere", '"my file.txt":1'):
        assert not host_problems(tmp_path, [_file_verdict(text)]), text
    for text in ("my file.txt:1", '"my file.txt', '"my file.txt"x', '"nope.txt":1', '"a\\u0000b"'):
        assert host_problems(tmp_path, [_file_verdict(text)]), text


def _file_verdict(text: str):
    from validation.verdict import AssertionVerdict, Evidence

    return AssertionVerdict(key="VAL-1", verdict="pass", message="m", evidence=[Evidence(kind="file", text=text)])


def test_models_still_may_not_write_invisible_characters(tmp_path):
    from validation.verdict import AssertionVerdict, Evidence

    smuggled = AssertionVerdict(
        key="VAL-1", verdict="pass", message="all good\u200b", evidence=[Evidence(kind="other", text="ok")]
    )
    assert "no_invisible_characters" in host_problems(tmp_path, [smuggled])


@given(
    st.text(st.sampled_from(["a", " ", "\r", "\n", "\ufeff", "\u200b", "\U000f0000", "é"]), max_size=40),
    st.integers(min_value=0, max_value=60),
)
def test_line_numbers_never_pass_the_line_count(text, offset):
    offset = min(offset, len(text))
    assert 1 <= line_of(text, offset) <= max(line_count(text), 1)
    if offset and text[offset - 1] == "\n":
        assert line_of(text, offset) == line_of(text, offset - 1) + (offset < len(text))


NAME = st.text(st.sampled_from(list('ab. :"\\') + ["\u200b", "\ufeff", "\ue000", "é"]), min_size=1, max_size=12).filter(
    lambda n: n.strip() and n not in (".", "..") and not n.startswith("..")
)
CONTENT = st.one_of(
    st.binary(max_size=200),
    st.lists(st.sampled_from(["x", "y z", "\r", "\n", "\r\n", "\ufeff", "\u200b", ":", "\xff"]), max_size=30).map(
        lambda parts: "".join(parts).encode("utf-8", "surrogateescape")
    ),
)
PATTERN = st.one_of(
    st.sampled_from(["x", "y z", r"\r", r"\n", "\ufeff", "\u200b", "$", r"\Z", "^", "\ufffd", ":"]),
    st.text(max_size=3).map(re.escape),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAME, CONTENT, PATTERN, st.sampled_from(["exists", "contains", "not_contains"]))
def test_any_file_check_on_any_content_yields_a_verdict_the_host_accepts(name, content, pattern, test):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / name).write_bytes(content)
        check = {"file": name, test: True if test == "exists" else pattern}
        verdict = judge_assertion(root, _spec(check))
        assert verdict.verdict in ("pass", "fail")
        assert not host_problems(root, [verdict]), (check, verdict)
        if test != "exists":
            found = re.search(pattern, read_checkout_text(root / name), re.M) is not None
            assert (verdict.verdict == "pass") == (found == (test == "contains"))


# --- 4. expect_output sees the whole output -------------------------------------------------


def _printing(text_expr: str) -> str:
    return f'python -c "import sys; sys.stdout.write({text_expr})"'


@pytest.mark.parametrize(
    "expr, pattern",
    [
        ("'RESULT: OK\\n' + 'y' * 20_000", "RESULT: OK"),
        ("'x' * 1_000_000 + 'FINAL-MARK'", "FINAL-MARK$"),
        ("'RESULT: OK\\n' + 'y' * 20_000", "^RESULT"),
        ("'noise\\nRESULT: OK\\n'", "^RESULT"),
        ("'noise\\nRESULT: OK\\n'", "(?m)^RESULT"),
        ("'noise\\nRESULT: OK\\n'", "OK$"),
        ("'OK\\nnoise\\n'", "OK$"),
    ],
)
def test_expect_output_is_re_search_over_the_whole_output(tmp_path, settings, expr, pattern):
    output = subprocess.run(_printing(expr), shell=True, capture_output=True, text=True, check=True).stdout
    verdict = judge_assertion(tmp_path, _spec({"run": _printing(expr), "expect_output": pattern}))
    assert verdict.verdict == ("pass" if re.search(pattern, output) else "fail"), (pattern, verdict.actual)
    assert len(verdict.evidence[0].text) < settings.FUSION_CHECK_OUTPUT_BYTES + 200  # only the evidence is capped


def test_run_command_searches_the_whole_output_but_keeps_the_tail(tmp_path):
    command = _printing("'HEAD-MARK\\n' + 'y' * 100_000")
    found = run_command(command, cwd=tmp_path, timeout=30, max_output=1000, shell=True, match="^HEAD-MARK")
    assert found.matched is True and found.truncated and "HEAD-MARK" not in found.output
    assert run_command(command, cwd=tmp_path, timeout=30, max_output=1000, shell=True, match="absent").matched is False
    assert run_command(command, cwd=tmp_path, timeout=30, max_output=1000, shell=True).matched is None
