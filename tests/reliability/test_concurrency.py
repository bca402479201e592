"""Concurrency: threads with their own database connections, released
together by a barrier, against the real API. Runs on SQLite (IMMEDIATE transactions
serialize the writers) and on PostgreSQL (row locks and partial unique indexes decide).

- 50 simultaneous `validate` calls on one feature: exactly one 202, every other call a
  409 `validation_already_running`, one run, one `validator-run:started` event;
- 20 simultaneous completions of one task: one completion event, one run, which a
  real worker then judges;
- simultaneous imports of the same mission file: one mission, one milestone, one
  feature, whoever wins; every caller gets the mission.
"""

from __future__ import annotations

import pytest
import yaml
from rest_framework.test import APIClient

from missions.models import Milestone, Mission, MissionEvent, MissionFeature, Slice
from missions.services.tasks import task_create
from tests.reliability.conftest import race
from validation.models import RunStatus, ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)

GREETING = {"file": "hello.py", "contains": r"def hello\("}


@pytest.fixture
def hello(build_mission, git_repo) -> MissionFeature:
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"})
    build_mission({"hello": [("VAL-1", GREETING)]})
    return MissionFeature.objects.get(key="hello")


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_fifty_simultaneous_validate_calls_give_exactly_one_202(idle_broker, hello, alice):
    def validate():
        response = _client(alice).post(f"/api/features/{hello.pk}/validate/", {}, format="json")
        return response.status_code, response.json()

    results = race(*[validate] * 50)
    codes = sorted(code for code, _ in results)
    assert codes == [202] + [409] * 49, codes
    assert {body["code"] for code, body in results if code == 409} == {"validation_already_running"}
    run = ValidatorRun.objects.get(feature=hello)
    accepted = next(body for code, body in results if code == 202)
    assert accepted["id"] == run.pk and run.status == RunStatus.RUNNING and run.validator_attempt == 1
    hello.refresh_from_db()
    assert hello.loop_state == "validating" and hello.validator_attempts == 1 and hello.last_run_id == run.pk
    assert MissionEvent.objects.filter(type="validator-run:started", payload__feature=hello.pk).count() == 1
    seqs = list(MissionEvent.objects.filter(mission=hello.mission).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))  # the audit log stayed gapless under the race


def test_twenty_simultaneous_completions_of_one_task_make_one_run(worker, hello, alice, git_repo):
    task = task_create(user=alice, feature=hello)
    revision = git_repo.git("rev-parse", "HEAD").strip()

    def complete():
        response = _client(alice).post(
            f"/api/tasks/{task.pk}/complete/", {"revision": revision, "summary": "done"}, format="json"
        )
        return response.status_code

    codes = race(*[complete] * 20)
    assert codes == [200] * 20, codes
    worker.drain()
    assert MissionEvent.objects.filter(type="task:updated", payload__change="completed").count() == 1
    run = ValidatorRun.objects.get(feature=hello)
    assert run.status == RunStatus.PASSED and run.revision == revision
    hello.refresh_from_db()
    assert hello.loop_state == "passed"
    assert MissionEvent.objects.filter(type="validator-run:started", payload__feature=hello.pk).count() == 1


MISSION_FILE = {
    "mission": {"key": "twin", "title": "Twin import", "status": "active"},
    "milestones": [
        {
            "key": "m1",
            "title": "Milestone",
            "assertions": [{"key": "VAL-T-1", "title": "holds", "statement": "it holds"}],
            "slices": [
                {
                    "key": "s1",
                    "title": "Slice",
                    "features": [{"key": "f1", "title": "Feature", "assertions": ["VAL-T-1"]}],
                }
            ],
        }
    ],
}


@pytest.mark.parametrize("racers", [12])
def test_simultaneous_imports_of_one_mission_file_make_one_mission(idle_broker, alice, racers):
    text = yaml.safe_dump(MISSION_FILE)

    def import_():
        response = _client(alice).post("/api/missions/import/", text, content_type="application/yaml")
        return response.status_code, response.json()

    results = race(*[import_] * racers)
    codes = sorted(code for code, _ in results)
    assert codes == [200] * (racers - 1) + [201], results
    mission = Mission.objects.get(key="twin")
    assert {body["id"] for _code, body in results} == {mission.pk}
    assert Milestone.objects.filter(mission=mission).count() == 1
    assert Slice.objects.filter(mission=mission).count() == 1
    assert MissionFeature.objects.filter(mission=mission).count() == 1
    assert mission.assertions.count() == 1
    assert MissionEvent.objects.filter(mission=mission, type="mission:imported", payload__created=True).count() == 1


def test_simultaneous_cli_and_api_imports_make_one_mission(idle_broker, alice, tmp_path):
    from django.core.management import call_command

    path = tmp_path / "twin.yaml"
    path.write_text(yaml.safe_dump(MISSION_FILE))

    def cli():
        with open(tmp_path / f"out-{id(object())}", "w") as out:
            call_command("import_mission", str(path), stdout=out)
        return "cli"

    def api():
        return (
            _client(alice).post("/api/missions/import/", path.read_text(), content_type="application/yaml").status_code
        )

    results = race(cli, cli, cli, api, api, api)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert Mission.objects.filter(key="twin").count() == 1
    assert MissionFeature.objects.filter(mission__key="twin").count() == 1


def test_a_stranger_racing_an_import_of_the_same_new_key_never_writes_to_it(idle_broker, django_user_model):
    """Two users import a file with the same new key at once: one creates the mission;
    the other is refused (`mission_key_taken`) — never a silent update of a mission that
    became someone else's between the check and the write."""
    first = django_user_model.objects.create_user("first")
    second = django_user_model.objects.create_user("second")
    mine = yaml.safe_dump({**MISSION_FILE, "mission": {**MISSION_FILE["mission"], "title": "first's"}})
    theirs = yaml.safe_dump({**MISSION_FILE, "mission": {**MISSION_FILE["mission"], "title": "second's"}})
    for _round in range(4):
        Mission.objects.filter(key="twin").delete()

        def by(user, text):
            return lambda: _client(user).post("/api/missions/import/", text, content_type="application/yaml")

        r1, r2 = race(by(first, mine), by(second, theirs))
        codes = sorted([r1.status_code, r2.status_code])
        assert codes == [201, 403], (r1.json(), r2.json())
        winner, loser = (r1, r2) if r1.status_code == 201 else (r2, r1)
        assert loser.json()["code"] == "mission_key_taken"
        mission = Mission.objects.get(key="twin")
        assert mission.title == winner.json()["title"]
        assert mission.owner.username == ("first" if winner is r1 else "second")
