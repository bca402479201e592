"""Another mission cannot poison the shared mirror (docs/REPOSITORIES.md, "The mirror
cache"; docs/TRUTH.md).

A check that finds the worker's mirror (it lies next to the snapshots, under the same data
folder) writes a replace ref into it that swaps a wrong commit for a passing one. A later
run of another mission, over the same URL, judging that wrong commit must fail: the
host's git ignores replace objects and grafts, and a mirror that carries them is made
again from the source.
"""

from __future__ import annotations

import shlex
import subprocess

import pytest

from fusion_site.repos import mirrors
from fusion_site.repos.snapshots import as_source, is_ancestor, snapshot
from validation.models import RunStatus, ValidatorRun

from .conftest import complete, feature, fetch_lines, git, url_mission


def runs_of(mission, key: str) -> list[ValidatorRun]:
    return list(ValidatorRun.objects.filter(feature=feature(mission, key)).order_by("id"))


@pytest.mark.django_db(transaction=True)
def test_a_replace_ref_a_check_wrote_into_the_mirror_never_passes_another_missions_wrong_commit(
    worker, served, alice, settings
):
    # Unsandboxed, where a check can write the mirror: the mirror guard is the second line
    # (in the sandbox the write itself fails: tests/sandbox/test_escape.py).
    settings.FUSION_SANDBOX = "off"
    good = served.commit({"f1.txt": "done f1\n", "p1.txt": "done p1\n"}, "the right f1")
    wrong = served.commit({"f1.txt": "not yet f1\n"}, "a wrong f1")
    mirror = mirrors.mirror_dir(as_source(served.url))
    poison = ["git", f"--git-dir={mirror}", "replace", "-f", wrong, good]
    poisoner = url_mission(alice, served.url, ("p1",), key="poisoner")
    # The poisoner's own feature: its done check, and a check that writes into the mirror.
    target = feature(poisoner, "p1")
    target.assertions.create(
        milestone=target.slice.milestone,
        key="VAL-p1-extra",
        title="the extra check holds",
        statement="it runs",
        check_spec={"run": shlex.join(poison)},
    )
    complete(alice, poisoner, "p1", good)
    worker.drain()
    [run] = runs_of(poisoner, "p1")
    assert run.status == RunStatus.PASSED, run.verdict  # its check wrote the replace ref
    assert git("for-each-ref", "--format=%(refname)", "refs/replace/", cwd=mirror) == f"refs/replace/{wrong}"

    victim = url_mission(alice, served.url, ("f1",), key="victim")
    complete(alice, victim, "f1", wrong)
    worker.drain()

    [judged] = runs_of(victim, "f1")
    assert judged.revision == wrong and judged.status == RunStatus.FAILED
    [verdict] = judged.verdict["assertions"]
    assert verdict["verdict"] == "fail" and verdict["actual"] == "no match"
    # The poisoned mirror was made again from the source: no replace ref is left in it.
    assert git("for-each-ref", "refs/replace/", cwd=mirror) == ""
    assert fetch_lines(mirror) == ["clone", f"blobs {wrong}"]


@pytest.mark.parametrize("form", ["replace ref", "packed replace ref", "grafts file"])
def test_a_mirror_carrying_rewritten_objects_is_made_again_before_it_is_read(served, form):
    good = served.commit({"f1.txt": "done f1\n"}, "the right f1")
    wrong = served.commit({"f1.txt": "not yet f1\n"}, "a wrong f1")
    source = as_source(served.url)
    mirror = mirrors.ensure_mirror(source)
    if form == "grafts file":
        (mirror / "info").mkdir(exist_ok=True)
        (mirror / "info" / "grafts").write_text(f"{wrong}\n")  # the wrong commit without a parent
    else:
        subprocess.run(["git", f"--git-dir={mirror}", "replace", "-f", wrong, good], check=True)
        if form == "packed replace ref":
            subprocess.run(["git", f"--git-dir={mirror}", "pack-refs", "--all", "--prune"], check=True)
            assert not any((mirror / "refs" / "replace").iterdir())

    with snapshot(source, wrong, label="run-1") as folder:
        assert (folder / "f1.txt").read_text() == "not yet f1\n"
    assert not (mirror / "info" / "grafts").exists()
    assert git("for-each-ref", "refs/replace/", cwd=mirror) == ""
    assert fetch_lines(mirror) == ["clone", f"blobs {wrong}"]  # the new mirror's own log
    assert is_ancestor(source, good, wrong)  # the history as the source has it


@pytest.mark.django_db(transaction=True)
def test_a_checks_environment_names_neither_the_mirror_cache_nor_a_repository(worker, served, alice, settings):
    revision = served.commit({"f1.txt": "done f1\n"}, "the right f1")
    mission = url_mission(alice, served.url, ("f1",), key="env")
    target = feature(mission, "f1")
    target.assertions.create(
        milestone=target.slice.milestone, key="VAL-env", title="env", statement="env", check_spec={"run": "env"}
    )
    complete(alice, mission, "f1", revision)
    worker.drain()
    [run] = runs_of(mission, "f1")
    output = next(a for a in run.verdict["assertions"] if a["key"] == "VAL-env")["evidence"][0]["text"]
    assert "PATH=" in output and f"GIT_CEILING_DIRECTORIES={settings.FUSION_SNAPSHOT_DIR}" in output
    assert str(settings.FUSION_REPO_CACHE) not in output and "GIT_DIR" not in output
