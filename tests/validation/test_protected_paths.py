"""Protected paths: an implementation cannot pass its checks by rewriting its own tests.

Before any check runs, every protected path of the snapshot is restored to its base
revision content; the verdict of every check records which protected files of the base
the implementation changed or deleted, and fails on it unless the mission judges the
restored files (`on_protected_change: restore`). Files it added under a protected path
are set aside and reported, never a reason to fail. Real runs over real git repositories, through
admission; then the mission fields through the API, the mission file and the admin.
"""

from __future__ import annotations

import stat
import subprocess

import pytest
import yaml

from fusion_site.repos.snapshots import snapshot_root
from missions.checks_spec import pattern_problems
from missions.errors import Invalid
from missions.models import Mission, MissionFeature
from missions.services.files import mission_export, mission_import
from validation import protect
from validation.models import JournalEntry, RunStatus
from validation.replay import replay_run
from validation.services import runner
from validation.services.verdicts.admit import feature_admit

TEST_CALC = "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n"
BASE = {
    "calc.py": "def add(a, b):\n    raise NotImplementedError\n",
    "tests/__init__.py": "",
    "tests/test_calc.py": TEST_CALC + "        self.assertEqual(add(2, 2), 4)\n",
    "tests/test_other.py": "import unittest\n",
}
BINARY = bytes(range(256))  # not text: restored byte for byte
WRONG = "def add(a, b):\n    return a - b\n"
RIGHT = "def add(a, b):\n    return a + b\n"
UNITTEST = {"run": "python -m unittest -q tests.test_calc"}
CHANGED = ["tests/data.bin", "tests/test_calc.py", "tests/test_other.py"]  # of the base: modified or deleted
ADDED = "set aside 1 file the implementation added under protected paths: tests/test_new.py"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("idle_broker")]


@pytest.fixture
def base(git_repo) -> str:
    for rel, text in BASE.items():
        git_repo.write(rel, text)
    (git_repo.path / "tests/data.bin").write_bytes(BINARY)
    return git_repo.commit(message="tests first")


def implement(git_repo, calc: str = WRONG) -> str:
    """An implementation that rewrites its tests until they pass, adds one, deletes one."""
    (git_repo.path / "tests/test_other.py").unlink()
    (git_repo.path / "tests/data.bin").write_bytes(b"changed")
    return git_repo.commit(
        {
            "calc.py": calc,
            "tests/test_new.py": "import unittest\n",
            "docs/notes.md": "done\n",
            "tests/test_calc.py": TEST_CALC + "        self.assertEqual(add(2, 2), 0)\n",
        }
    )


def protected_mission(build_mission, base: str, checks: list[dict], *, paths=("tests/**",), on_change="fail"):
    mission = build_mission({"calc": [(f"VAL-{i}", c) for i, c in enumerate(checks, 1)]})
    Mission.objects.filter(pk=mission.pk).update(
        protected_paths=list(paths), base_revision=base, on_protected_change=on_change
    )
    return MissionFeature.objects.get(key="calc")


def execute(feature: MissionFeature):
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    runner.execute_run(run.pk)
    run.refresh_from_db()
    assert run.verdict is not None, run.error
    return run, {a["key"]: a for a in run.verdict["assertions"]}


# ------------------------------------------------------------------ runs


def test_admission_freezes_the_protection_and_a_changed_test_fails_the_check(build_mission, git_repo, base):
    implement(git_repo)
    feature = protected_mission(build_mission, base, [UNITTEST, {"file": "calc.py", "contains": "def add"}])
    run, verdicts = execute(feature)
    assert run.protection == {"paths": ["tests/**"], "on_change": "fail", "base": base, "runner_config": True}
    assert run.status == RunStatus.FAILED
    note = "the implementation changed protected files: " + ", ".join(CHANGED)
    for key in ("VAL-1", "VAL-2"):  # every assertion whose check ran, not only the test run
        verdict = verdicts[key]
        assert verdict["verdict"] == "fail" and verdict["message"] == note
        assert verdict["expected"] and verdict["actual"]
        assert verdict["evidence"][-2:] == [{"kind": "other", "text": ADDED}, {"kind": "other", "text": note}]
    # The rewritten test was not run: the check itself failed against the base test.
    assert verdicts["VAL-1"]["actual"] == "3 protected files changed; with them restored, the check itself failed"
    journaled = {e.key: e.payload["result"] for e in JournalEntry.objects.filter(run_id=run.pk, kind="check")}
    assert journaled == verdicts, "the journal holds the final verdicts"
    assert replay_run(run.pk).ok


def test_restore_judges_the_restored_files_and_notes_the_change(build_mission, git_repo, base):
    implement(git_repo, calc=WRONG)
    feature = protected_mission(build_mission, base, [UNITTEST], on_change="restore")
    run, verdicts = execute(feature)
    assert run.status == RunStatus.FAILED  # the base test catches the wrong code
    assert verdicts["VAL-1"]["actual"] == "exit 1"
    assert verdicts["VAL-1"]["verdict"] == "fail"
    assert verdicts["VAL-1"]["evidence"][-1]["text"].startswith("the implementation changed protected files: ")


def test_restore_passes_right_code_whose_tests_were_touched(build_mission, git_repo, base):
    implement(git_repo, calc=RIGHT)
    feature = protected_mission(build_mission, base, [UNITTEST], on_change="restore")
    run, verdicts = execute(feature)
    assert run.status == RunStatus.PASSED, verdicts
    assert verdicts["VAL-1"]["evidence"][-1] == {
        "kind": "other",
        "text": "the implementation changed protected files: " + ", ".join(CHANGED),
    }


def test_the_validators_see_the_restored_snapshot_and_the_repository_is_untouched(
    build_mission, git_repo, base, monkeypatch
):
    implement(git_repo)
    feature = protected_mission(build_mission, base, [UNITTEST])
    seen = {}
    real_judge = runner.judge

    def spying(ctx):
        root = ctx.checkout
        seen.update(
            calc=(root / "tests/test_calc.py").read_text(),
            new=(root / "tests/test_new.py").exists(),
            other=(root / "tests/test_other.py").read_text(),
            data=(root / "tests/data.bin").read_bytes(),
            notes=(root / "docs/notes.md").read_text(),
            changed=ctx.protection.changed,
            added=ctx.protection.added,
            writable=[
                rel
                for rel in ("tests/test_calc.py", "tests/test_other.py", "tests/data.bin")
                if (root / rel).stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
            ],
        )
        return real_judge(ctx)

    monkeypatch.setattr(runner, "judge", spying)
    execute(feature)
    assert seen == {
        "calc": BASE["tests/test_calc.py"],
        "new": False,
        "other": BASE["tests/test_other.py"],
        "data": BINARY,
        "notes": "done\n",
        "changed": tuple(CHANGED),
        "added": ("tests/test_new.py",),
        "writable": [],
    }
    assert git_repo.git("status", "--porcelain") == ""
    assert "assertEqual(add(2, 2), 0)" in (git_repo.path / "tests/test_calc.py").read_text()
    assert sorted(snapshot_root().iterdir()) == []


def test_a_protected_folder_replaced_by_a_symlink_is_restored_inside_the_snapshot(
    build_mission, git_repo, base, tmp_path, monkeypatch
):
    outside = tmp_path / "outside"
    outside.mkdir()
    git_repo.git("rm", "-rq", "tests")
    (git_repo.path / "tests").symlink_to(outside)
    git_repo.commit({"calc.py": WRONG})
    feature = protected_mission(build_mission, base, [UNITTEST], on_change="restore")
    seen = {}
    real_judge = runner.judge

    def spying(ctx):
        seen["real folder"] = (ctx.checkout / "tests").is_dir() and not (ctx.checkout / "tests").is_symlink()
        return real_judge(ctx)

    monkeypatch.setattr(runner, "judge", spying)
    run, verdicts = execute(feature)
    assert seen == {"real folder": True}
    assert list(outside.iterdir()) == [], "a restore wrote through the symlink, outside the snapshot"
    assert verdicts["VAL-1"]["actual"] == "exit 1" and run.status == RunStatus.FAILED


def test_a_checks_own_protect_applies_to_that_check_only(build_mission, git_repo, base, settings):
    settings.FUSION_CHECK_PARALLELISM = 4
    implement(git_repo)
    guarded = {**UNITTEST, "protect": ["tests/test_calc.py"]}
    feature = protected_mission(build_mission, base, [guarded, UNITTEST], paths=())
    run, verdicts = execute(feature)
    # frozen at admission too: no mission paths, the base a check's own `protect` restores from
    assert run.protection["paths"] == [] and len(run.protection["base"]) == 40
    assert verdicts["VAL-1"]["verdict"] == "fail"
    assert verdicts["VAL-1"]["message"] == "the implementation changed protected files: tests/test_calc.py"
    # Unprotected, the rewritten test passes the wrong code: what protection is for.
    assert verdicts["VAL-2"]["verdict"] == "pass" and len(verdicts["VAL-2"]["evidence"]) == 1


def test_a_file_check_whose_file_is_protected_judges_the_base_content(build_mission, git_repo, base):
    implement(git_repo)
    checks = [
        {"file": "tests/test_calc.py", "contains": r"add\(2, 2\), 4", "protect": ["tests/**"]},
        {"file": "tests/test_calc.py", "contains": r"add\(2, 2\), 4"},
    ]
    feature = protected_mission(build_mission, base, checks, paths=(), on_change="restore")
    run, verdicts = execute(feature)
    assert verdicts["VAL-1"]["verdict"] == "pass"
    # not the checkout's file; then the notes: test_new.py set aside, the changes restored
    assert [e["kind"] for e in verdicts["VAL-1"]["evidence"]] == ["other", "other", "other"]
    assert verdicts["VAL-2"]["verdict"] == "fail" and verdicts["VAL-2"]["evidence"][0]["kind"] == "file"


def test_own_protect_without_a_base_revision_is_blocked(build_mission, git_repo, base):
    implement(git_repo)
    feature = protected_mission(build_mission, "", [{**UNITTEST, "protect": ["tests/**"]}], paths=())
    run, verdicts = execute(feature)
    assert verdicts["VAL-1"]["verdict"] == "blocked" and "no base revision" in verdicts["VAL-1"]["message"]


def test_nothing_changed_means_no_note(build_mission, git_repo, base):
    git_repo.commit({"calc.py": RIGHT})
    feature = protected_mission(build_mission, base, [UNITTEST])
    run, verdicts = execute(feature)
    assert run.status == RunStatus.PASSED and len(verdicts["VAL-1"]["evidence"]) == 1


# ------------------------------------------------------------------ patterns


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("tests/**", ["tests/a.py", "tests/a/b/c.py"], ["tests", "testsx/a.py", "src/tests/a.py"]),
        ("**/test_*.py", ["test_a.py", "a/b/test_c.py"], ["a/b/c_test.py", "test_a.pyc"]),
        ("*.py", ["a.py"], ["a/b.py"]),
        ("docs/", ["docs/x", "docs/x/y.md"], ["docs", "mydocs/x"]),
        ("src/*/fixtures/**", ["src/a/fixtures/x.json"], ["src/a/b/fixtures/x.json"]),
        ("data/[!x]?.csv", ["data/ab.csv"], ["data/xb.csv", "data/a/b.csv"]),
        ("./tests/**", ["tests/a.py"], []),
    ],
)
def test_glob_semantics(pattern, yes, no):
    assert [p for p in yes if protect.matches(p, [pattern])] == yes
    assert [p for p in no if protect.matches(p, [pattern])] == []


def test_pattern_problems():
    assert pattern_problems(["tests/**", "a/*.py"]) == []
    assert pattern_problems("tests/**") == ["protected_paths: must be a list of glob patterns"]
    assert pattern_problems(["", "/etc/x", "a/../b", "a\x00b", 3]) == [
        "protected_paths[0]: must be a non-empty string",
        "protected_paths[1]: must be relative to the workspace, not an absolute path",
        "protected_paths[2]: must not contain `..`",
        "protected_paths[3]: must not contain a NUL character",
        "protected_paths[4]: must be a non-empty string",
    ]


# ------------------------------------------------------------------ mission fields


def test_api_reads_and_validates_the_mission_fields(api_for, staff):
    api = api_for(staff)
    refused = api.post("/api/missions/", {"key": "p", "title": "P", "protected_paths": ["tests/**"]}, format="json")
    assert refused.status_code == 400 and refused.json()["code"] == "base_revision_required", refused.json()
    assert "base_revision" in refused.json()["fields"]
    created = api.post(
        "/api/missions/",
        {
            "key": "p",
            "title": "P",
            "protected_paths": ["tests/**"],
            "base_revision": "main",
            "on_protected_change": "restore",
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert (body["protected_paths"], body["on_protected_change"]) == (["tests/**"], "restore")
    url = f"/api/missions/{body['id']}/"
    cleared = api.patch(url, {"base_revision": ""}, format="json")
    assert cleared.status_code == 400 and cleared.json()["code"] == "base_revision_required"
    bad = api.patch(url, {"protected_paths": ["ok/**", "../up"]}, format="json")
    assert bad.status_code == 400
    assert bad.json()["fields"]["protected_paths"] == ["protected_paths[1]: must not contain `..`"]
    assert api.patch(url, {"on_protected_change": "ignore"}, format="json").status_code == 400
    assert api.patch(url, {"protected_paths": [], "base_revision": ""}, format="json").status_code == 200
    assert Mission.objects.get(pk=body["id"]).protected_paths == []


DOCUMENT = {
    "mission": {
        "key": "pf",
        "title": "Protected",
        "base_revision": "abc123",
        "protected_paths": ["tests/**"],
        "on_protected_change": "restore",
    },
    "milestones": [],
}


def test_mission_file_imports_and_exports_the_fields():
    mission, _changed = mission_import(document=DOCUMENT)
    assert (mission.protected_paths, mission.on_protected_change) == (["tests/**"], "restore")
    exported = mission_export(mission=mission)
    data = yaml.safe_load(exported)["mission"]
    assert (data["protected_paths"], data["on_protected_change"]) == (["tests/**"], "restore")
    assert mission_import(document=exported)[1] is False
    plain, _ = mission_import(document={"mission": {"key": "plain", "title": "Plain"}, "milestones": []})
    assert (plain.protected_paths, plain.on_protected_change) == ([], "fail")


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        (
            {"base_revision": ""},
            "mission.base_revision: required when protected_paths is set (protected files are restored from it)",
        ),
        (
            {"protected_paths": ["ok", "/abs"]},
            "mission.protected_paths[1]: must be relative to the workspace, not an absolute path",
        ),
        ({"protected_paths": "tests/**"}, "mission.protected_paths: must be a list of glob patterns"),
        ({"on_protected_change": "ignore"}, "mission.on_protected_change: must be one of fail, restore"),
    ],
)
def test_mission_file_errors_name_the_path(fields, error):
    with pytest.raises(Invalid) as caught:
        mission_import(document={**DOCUMENT, "mission": {**DOCUMENT["mission"], **fields}})
    assert error in caught.value.fields["errors"]


def _change_form(response) -> dict:
    """The POST body of the admin change form as the page sends it unchanged (main form, inlines)."""
    data = {}
    forms = [response.context["adminform"].form]
    for inline in response.context["inline_admin_formsets"]:
        forms += [inline.formset.management_form, *inline.formset.forms]
    for form in forms:
        for name, field in form.fields.items():
            value = form[name].value()
            if value is not None and value is not False:
                data[form.add_prefix(name)] = "on" if value is True else value
            if field.show_hidden_initial:  # a field with a callable default: the page sends its initial value too
                data[form.add_initial_prefix(name)] = field.prepare_value(form[name].initial)
    return data


def test_admin_validates_the_fields(admin_client, admin_user):
    mission = Mission.objects.create(key="adm", title="Adm", owner=admin_user)
    url = f"/admin/missions/mission/{mission.pk}/change/"
    data = _change_form(admin_client.get(url))
    refused = admin_client.post(url, {**data, "protected_paths": '["tests/**"]', "base_revision": ""})
    assert refused.status_code == 200
    assert "Set a base revision: protected paths are restored from it." in refused.content.decode()
    refused = admin_client.post(url, {**data, "protected_paths": '["../x"]', "base_revision": "main"})
    assert refused.status_code == 200 and "protected_paths[0]: must not contain `..`" in refused.content.decode()
    saved = admin_client.post(
        url, {**data, "protected_paths": '["tests/**"]', "base_revision": "main", "on_protected_change": "restore"}
    )
    assert saved.status_code == 302
    mission.refresh_from_db()
    assert (mission.protected_paths, mission.on_protected_change) == (["tests/**"], "restore")
    data = _change_form(admin_client.get(url))
    assert admin_client.post(url, {**data, "protected_paths": "", "base_revision": ""}).status_code == 302
    mission.refresh_from_db()
    assert mission.protected_paths == []


def test_the_demo_mission_protects_its_tests(tmp_path, alice):
    from missions.management.commands.demo import create_demo

    mission = create_demo(directory=tmp_path / "demo-repo", user=alice)
    first = subprocess.run(
        ["git", "-C", mission.repository, "rev-list", "--max-parents=0", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert (mission.protected_paths, mission.base_revision) == (["tests/**"], first)
