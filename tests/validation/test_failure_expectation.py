"""A failed run check's evidence states the whole expectation — its exit code and the
output it expects — wherever a person reads the failure: the API's run and the run page."""

from __future__ import annotations

import pytest

from missions.models import MissionFeature
from validation.models import RunStatus

pytestmark = pytest.mark.django_db(transaction=True)

CHECK = {"run": "python report.py", "expect_output": r"RESULT: \d+ ok"}
WHOLE = r"`python report.py` exits 0 and its output matches /RESULT: \d+ ok/"


def test_the_failure_shows_the_exit_code_and_the_expected_output(
    worker, git_repo, build_mission, alice, api_for, client
):
    git_repo.commit({"report.py": "import sys\nprint('RESULT: 2 failing')\nsys.exit(1)\n"}, "a failing report")
    build_mission({"report": [("VAL-R", CHECK)]})
    feature = MissionFeature.objects.get(key="report")
    api = api_for(alice)
    started = api.post(f"/api/features/{feature.pk}/validate/", {}, format="json")
    assert started.status_code == 202, started.json()
    worker.drain()

    run = api.get(f"/api/validation-runs/{started.json()['id']}/").json()
    assert run["status"] == RunStatus.FAILED
    [failure] = run["failures"]
    assert (failure["assertion_key"], failure["expected"], failure["actual"]) == ("VAL-R", WHOLE, "exit 1")
    assert "RESULT: 2 failing" in failure["evidence"][0]["text"]
    client.force_login(alice)
    page = client.get(f"/runs/{run['id']}/").content.decode()
    assert f"<dt>Expected</dt><dd><pre>{WHOLE}</pre></dd>" in page
