"""No git command writes to a user's repository during validation (docs/REPOSITORIES.md):
a mission over a local path is judged from the worker's mirror of it, and the
repository — its `.git` and its working tree, uncommitted work included — is
byte-for-byte what it was, down to the modification time of every file and folder."""

from __future__ import annotations

import pytest

from missions.models import MissionFeature
from validation.models import RunStatus, ValidatorRun

from .conftest import complete, feature, loop_state, mirror_of, tree_digest, url_mission

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_full_validation_leaves_the_users_repository_exactly_as_it_was(worker, git_repo, alice, settings):
    base = git_repo.commit({"tests/test_f1.py": "assert True\n"}, "the tests")
    mission = url_mission(alice, str(git_repo.path), ("f1", "f2"), base_revision=base, protected_paths=["tests/**"])
    git_repo.commit({"f1.txt": "done f1\n"}, "implement f1")
    git_repo.git("tag", "-a", "v1", "-m", "v1")
    wrong = git_repo.commit({"f2.txt": "not yet f2\n"}, "f2, wrong")
    git_repo.git("branch", "feature/f2")
    git_repo.write("wip.txt", "the user's uncommitted work\n")
    git_repo.write("f1.txt", "edited, not committed\n")
    before = tree_digest(git_repo.path)
    assert any(name.startswith(".git/objects/") for name in before)

    complete(alice, mission, "f1", "v1")  # a tag: read with ls-remote from the path
    complete(alice, mission, "f2", wrong[:9])  # a short id: looked up after a refresh
    worker.drain()
    fix = MissionFeature.objects.get(generated_from=feature(mission, "f2"))
    complete(alice, mission, fix.key, "feature/f2")  # a branch
    worker.drain()

    assert loop_state(mission, "f1") == "passed"
    assert ValidatorRun.objects.filter(feature=feature(mission, "f2"), status=RunStatus.FAILED).count() == 1
    assert ValidatorRun.objects.filter(feature=fix, status=RunStatus.FAILED).count() == 1
    assert mirror_of(mission).parent == settings.FUSION_REPO_CACHE  # judged from the mirror
    after = tree_digest(git_repo.path)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert changed == [], f"validation wrote to the user's repository: {changed[:20]}"
