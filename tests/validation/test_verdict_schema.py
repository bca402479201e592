"""The per-run verdict schema of the `schema` output mode and the host's conversion of a
keyed answer to the contract's list form (validation/verdict_schema.py)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from validation import verdict_schema
from validation.validators.repair import assess
from validation.verdict import FrozenContext, normalize
from validation.verdict_schema import (
    EVIDENCE_MAX,
    LINE_ENUM_TOTAL,
    OTHER_KINDS,
    TEXT_MAX,
    build_verdict_schema,
    checkout_files,
    parse_answer,
    response_format,
    to_contract,
)

KEYS = ("VAL-1", "VAL-2", "VAL-3")
FILES = {"hello.py": 3, "pkg/mod.py": 3, "with space.txt": 3}  # path: its lines (the checkout fixture's)


def keyed(**items) -> dict:
    return {"summary": "judged", "assertions": items}


def judged(verdict="pass", **fields) -> dict:
    return {
        "verdict": verdict,
        "message": fields.get("message", "because"),
        "expected": fields.get("expected", ""),
        "actual": fields.get("actual", ""),
        "evidence": fields.get("evidence", [{"kind": "other", "text": "looked"}]),
    }


def valid(doc, schema) -> bool:
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.fixture
def checkout(tmp_path):
    for rel in FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("one\ntwo\nthree\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    return tmp_path


@pytest.mark.parametrize("dialect", ["openai", "llama_cpp"])
def test_every_key_exactly_once_and_nothing_else(dialect):
    schema = build_verdict_schema(keys=KEYS, files=FILES, dialect=dialect)
    all_three = keyed(**{k: judged() for k in KEYS})
    assert valid(all_three, schema)
    assert not valid(keyed(**{k: judged() for k in KEYS[:2]}), schema)  # a key missing
    assert not valid(keyed(**{k: judged() for k in KEYS}, **{"VAL-9": judged()}), schema)  # a key invented
    assert not valid({**all_three, "status": "pass"}, schema)  # the status is the host's
    assert not valid(keyed(**{**all_three["assertions"], "VAL-1": judged("maybe")}), schema)
    assert not valid(keyed(**{**all_three["assertions"], "VAL-1": {**judged(), "extra": "x"}}), schema)
    assert not valid(keyed(**{**all_three["assertions"], "VAL-1": judged(evidence=[])}), schema)


@pytest.mark.parametrize("dialect", ["openai", "llama_cpp"])
def test_a_fail_explains_itself_and_file_evidence_names_a_checkout_file(dialect):
    schema = build_verdict_schema(keys=("VAL-1",), files=FILES, dialect=dialect)
    assert not valid(keyed(**{"VAL-1": judged("fail", expected="", actual="b")}), schema)
    assert valid(keyed(**{"VAL-1": judged("fail", expected="a", actual="b")}), schema)
    cite = [{"kind": "file", "path": "hello.py", "line": 2}]
    assert valid(keyed(**{"VAL-1": judged(evidence=cite)}), schema)
    assert not valid(keyed(**{"VAL-1": judged(evidence=[{**cite[0], "path": "nope.py"}])}), schema)
    assert not valid(keyed(**{"VAL-1": judged(evidence=[{**cite[0], "line": 0}])}), schema)
    assert not valid(keyed(**{"VAL-1": judged(evidence=[{**cite[0], "line": 4}])}), schema)  # past its end
    assert not valid(keyed(**{"VAL-1": judged(evidence=[{"kind": "file", "text": "hello.py:2"}])}), schema)
    blank = judged("fail", expected="   ", actual="b")
    # OpenAI's strict mode takes `pattern: \S`: blank is refused there. llama.cpp's compiler
    # takes only anchored patterns: only empty is refused, and the host refuses the blank one.
    assert valid(keyed(**{"VAL-1": blank}), schema) == (dialect == "llama_cpp")


@pytest.mark.parametrize("text", ["one\ntwo", 'say "hi"', "back\\slash"])
def test_llama_cpp_strings_leave_no_room_for_anything_but_strict_json(text, monkeypatch):
    pattern = build_verdict_schema(keys=("VAL-1",), files=FILES, dialect="llama_cpp")
    assert not valid(keyed(**{"VAL-1": judged(message=text)}), pattern)
    assert valid(keyed(**{"VAL-1": judged(message="plain 'quoted' text")}), pattern)
    monkeypatch.setattr(verdict_schema, "LLAMA_STRINGS", "lenient")
    lenient = build_verdict_schema(keys=("VAL-1",), files=FILES, dialect="llama_cpp")
    assert valid(keyed(**{"VAL-1": judged(message=text)}), lenient)  # the host reads it (below)


@pytest.mark.parametrize("dialect", ["openai", "llama_cpp"])
def test_each_file_names_only_its_own_lines(dialect):
    schema = build_verdict_schema(keys=("VAL-1",), files={"long.py": 40, "short.py": 2}, dialect=dialect)

    def cites(path, line):
        return valid(keyed(**{"VAL-1": judged(evidence=[{"kind": "file", "path": path, "line": line}])}), schema)

    assert cites("long.py", 40) and cites("short.py", 2)
    assert not cites("short.py", 3) and not cites("long.py", 41)


def test_the_line_enums_stay_small_however_many_files_of_however_many_lines():
    files = {f"f{n}.py": n for n in range(1, 201)}  # 200 files, 200 distinct line counts
    schema = build_verdict_schema(keys=("VAL-1",), files=files, dialect="llama_cpp")
    items = schema["$defs"]["evidence"]["items"]["anyOf"]
    entries = sum(len(i["properties"]["line"].get("enum", [])) for i in items if "path" in i["properties"])
    assert entries <= LINE_ENUM_TOTAL

    def cites(path, line):
        return valid(keyed(**{"VAL-1": judged(evidence=[{"kind": "file", "path": path, "line": line}])}), schema)

    assert cites("f3.py", 3) and not cites("f3.py", 4)  # a short file: its own lines only
    assert cites("f200.py", 200) and cites("f200.py", 201)  # a long one: the host checks its line
    assert all(cites(path, 1) for path in files) and not cites("nope.py", 1)


def test_a_whole_answer_is_bounded_where_the_server_takes_bounds():
    llama = build_verdict_schema(keys=("VAL-1",), files=FILES, dialect="llama_cpp")
    assert valid(keyed(**{"VAL-1": judged(message="m" * TEXT_MAX)}), llama)
    assert not valid(keyed(**{"VAL-1": judged(message="m" * (TEXT_MAX + 1))}), llama)
    other = [{"kind": "other", "text": "looked"}]
    for dialect in ("openai", "llama_cpp"):  # both take maxItems
        schema = build_verdict_schema(keys=("VAL-1",), files=FILES, dialect=dialect)
        assert valid(keyed(**{"VAL-1": judged(evidence=other * EVIDENCE_MAX)}), schema)
        assert not valid(keyed(**{"VAL-1": judged(evidence=other * (EVIDENCE_MAX + 1))}), schema)


def test_no_checkout_no_file_enum_and_an_empty_checkout_no_file_evidence(checkout):
    (checkout / "empty.txt").write_text("")
    assert checkout_files(checkout) == {**FILES, "empty.txt": 1}  # .git left out; a line 1 even when empty
    assert checkout_files(None) is None and checkout_files(checkout, limit=2) is None
    free = build_verdict_schema(keys=("VAL-1",), files=None, dialect="openai")
    assert valid(keyed(**{"VAL-1": judged(evidence=[{"kind": "file", "path": "any.py", "line": 1}])}), free)
    empty = build_verdict_schema(keys=("VAL-1",), files={}, dialect="openai")
    assert not valid(keyed(**{"VAL-1": judged(evidence=[{"kind": "file", "path": "any.py", "line": 1}])}), empty)


def test_response_format_forms():
    schema = build_verdict_schema(keys=KEYS, files=None, dialect="openai")
    assert response_format(schema, schema_format="openai") == {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "schema": schema, "strict": True},
    }
    assert response_format(schema, schema_format="llama_cpp") == {"type": "json_object", "schema": schema}


def test_conversion_to_the_contract_form():
    answer = keyed(
        **{
            "VAL-2": judged(
                "fail", expected="5", actual="6", evidence=[{"kind": "file", "path": "with space.txt", "line": 3}]
            ),
            "VAL-1": judged(),
            "VAL-3": judged("blocked"),
        }
    )
    doc = to_contract(answer, keys=KEYS)
    assert [a["key"] for a in doc["assertions"]] == list(KEYS)  # the frozen order
    assert doc["status"] == "blocked" and doc["summary"] == "judged"
    assert doc["assertions"][1]["evidence"] == [{"kind": "file", "text": '"with space.txt":3'}]
    assert to_contract([1, 2], keys=KEYS) == [1, 2] and to_contract("text", keys=KEYS) == "text"


def test_conversion_keeps_what_the_host_must_refuse(checkout):
    frozen = FrozenContext(keys=KEYS[:2], checkout=checkout)
    twice, parse = parse_answer(
        '{"summary": "", "assertions": {"VAL-1": {"verdict": "pass"}, "VAL-1": {"verdict": "fail"}, "VAL-2": 1}}'
    )
    assert parse == "json"
    _verdict, stage, failed = assess(to_contract(twice, keys=KEYS[:2]), frozen)
    assert stage == "schema" and any("assertions.2.verdict" in r for r in failed["schema"])
    items = {k: judged() for k in KEYS[:2]}
    one, two = json.dumps(items["VAL-1"]), json.dumps(items["VAL-2"])
    doubled = f'{{"summary": "", "assertions": {{"VAL-1": {one}, "VAL-1": {one}, "VAL-2": {two}}}}}'
    _verdict, stage, failed = assess(to_contract(parse_answer(doubled)[0], keys=KEYS[:2]), frozen)
    assert stage == "host" and failed["keys_accounted"] == ["VAL-1: judged 2 times; judge it exactly once"]
    inner = keyed(**{"VAL-1": {**items["VAL-1"], "key": "VAL-2"}, "VAL-2": items["VAL-2"]})
    _verdict, stage, failed = assess(to_contract(inner, keys=KEYS[:2]), frozen)
    assert stage == "schema" and any("inner_key" in r for r in failed["schema"])


def test_control_characters_inside_strings_are_read_and_said():
    assert parse_answer('{"a": "one\ntwo"}') == ({"a": "one\ntwo"}, "json-lenient")
    assert parse_answer('```json\n{"a": 1}\n```') == ({"a": 1}, "json")
    assert parse_answer("no json here") == ("no json here", "text")


# --- the property: whatever the schema admits, the host's shape validators accept ------

# Under LLAMA_STRINGS = "pattern" the schema's strings hold no quote, backslash or
# control character; otherwise any text.
PATTERN_FREE = st.characters(codec="utf-8", exclude_characters='"\\' + "".join(map(chr, range(32))))


def texts(strings: str, *, min_size: int = 0):
    alphabet = PATTERN_FREE if strings == "pattern" else st.characters(codec="utf-8")
    text = st.text(alphabet=alphabet, min_size=min_size, max_size=20)
    return text.filter(lambda s: s.strip()) if min_size else text


def evidence_item(strings: str):
    return st.one_of(
        st.fixed_dictionaries(
            {
                "kind": st.just("file"),
                "path": st.sampled_from(sorted(FILES)),
                "line": st.integers(min_value=1, max_value=3),
            }
        ),
        st.fixed_dictionaries({"kind": st.sampled_from(OTHER_KINDS), "text": texts(strings, min_size=1)}),
    )


@st.composite
def assertion_answer(draw, strings: str):
    verdict = draw(st.sampled_from(["pass", "fail", "blocked"]))
    text = texts(strings, min_size=1 if verdict == "fail" else 0)
    return {
        "verdict": verdict,
        "message": draw(text),
        "expected": draw(text),
        "actual": draw(text),
        "evidence": draw(st.lists(evidence_item(strings), min_size=1, max_size=3)),
    }


@st.composite
def schema_answers(draw, strings: str = "lenient"):
    keys = tuple(draw(st.lists(st.sampled_from(KEYS + ("VAL-9", "summary")), min_size=1, max_size=4, unique=True)))
    answer = {
        "summary": draw(texts(strings)),
        "assertions": {k: draw(assertion_answer(strings)) for k in keys},
    }
    return keys, answer


def assert_admitted_answer_passes_the_host(checkout, dialect: str, case) -> None:
    keys, answer = case
    schema = build_verdict_schema(keys=keys, files=checkout_files(checkout), dialect=dialect)
    jsonschema.validate(answer, schema)  # the strategy draws only what the schema admits
    candidate = to_contract(json.loads(json.dumps(answer)), keys=keys)
    verdict, stage, failed = assess(candidate, FrozenContext(keys=keys, checkout=checkout))
    # Invisible format characters are the one rule the schema leaves to the host.
    assert set(failed) <= {"no_invisible_characters"}, failed
    if not failed:
        assert verdict is not None and stage == ""
        assert normalize(verdict).status == candidate["status"]  # the host's status, derived twice alike


@pytest.mark.parametrize(
    "dialect, strings", [("openai", "lenient"), ("llama_cpp", "lenient"), ("llama_cpp", "pattern")]
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_anything_the_schema_admits_passes_the_host_shape_validators(checkout, monkeypatch, dialect, strings, data):
    monkeypatch.setattr(verdict_schema, "LLAMA_STRINGS", strings)
    assert_admitted_answer_passes_the_host(checkout, dialect, data.draw(schema_answers(strings)))


@settings(max_examples=200, deadline=None)
@given(case=schema_answers(), drop=st.booleans(), extra=st.sampled_from(["VAL-8", "status"]))
def test_a_missing_or_invented_key_is_never_admitted(case, drop, extra):
    keys, answer = case
    schema = build_verdict_schema(keys=keys, files=FILES, dialect="openai")
    assertions = dict(answer["assertions"])
    if drop:
        assertions.pop(keys[0])
    else:
        assertions[extra] = next(iter(answer["assertions"].values()))
    assert not valid({**answer, "assertions": assertions}, schema)
