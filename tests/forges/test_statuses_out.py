"""A judged revision answers on its forge: a `pending` status when its run starts, the
verdict's status when it ends (success, failure; error for a run that could not judge),
each (revision, state) posted once, in the order the loop decided them."""

from __future__ import annotations

import pytest
from django.conf import settings

from forges.models import Outbox, OutboxState
from forges.services.delivery import deliver
from missions.models import ContractAssertion, MissionFeature
from missions.services.tasks import task_complete, task_create
from tests.forges.conftest import BAD, GOOD, POLITE, RUDE
from tests.reliability.conftest import race
from validation.models import RunStatus, ValidatorRun
from validation.services.runner import execute_run
from validation.services.verdicts.admit import feature_admit, rerun

pytestmark = pytest.mark.django_db(transaction=True)


def hello() -> MissionFeature:
    return MissionFeature.objects.get(key="hello")


def deliver_pending() -> list[str]:
    return [deliver(outbox_id=pk) for pk in Outbox.objects.filter(state="pending").values_list("pk", flat=True)]


@pytest.mark.parametrize(
    ("files", "state", "description"),
    [(GOOD, "success", "2/2 assertions passed"), (RUDE, "failure", "1/2 assertions passed")],
)
def test_a_judged_revision_gets_pending_then_its_verdicts_status(
    idle_broker, forge_mission, git_repo, fake_forge, files, state, description
):
    forge_mission()
    sha = git_repo.commit(files)
    run = feature_admit(feature_id=hello().pk, trigger="manual", cause="validate").run
    assert deliver_pending() == ["delivered"]
    [pending] = fake_forge.statuses_of(sha)
    assert pending["state"] == "pending" and pending["description"] == "Validating 2 assertions"

    execute_run(run.pk)
    assert deliver_pending() == ["delivered"]
    first, last = fake_forge.statuses_of(sha)
    assert first == pending
    assert (last["state"], last["description"], last["context"]) == (state, description, "fusion-missions")
    assert last["target_url"] == f"{settings.FUSION_PUBLIC_URL}/runs/{run.pk}/"
    [request] = fake_forge.requests_to("POST", f"/statuses/{sha}")[-1:]
    assert request.path == f"/repos/acme/shop/statuses/{sha}"
    assert set(request.json) == {"state", "target_url", "description", "context"}


def test_the_loop_answers_on_the_forge_by_itself(worker, forge_mission, git_repo, fake_forge, alice):
    forge_mission()
    sha = git_repo.commit(BAD)
    task = task_create(user=alice, feature=hello())
    task_complete(user=alice, task=task, revision=sha)
    worker.drain()
    [run] = ValidatorRun.objects.all()
    assert run.status == RunStatus.FAILED
    states = [s["state"] for s in fake_forge.statuses_of(sha)]
    # The pending status may be superseded before it is sent (the verdict came first):
    # never sent after the verdict's, never twice.
    assert states in (["pending", "failure"], ["failure"])
    assert set(Outbox.objects.values_list("state", flat=True)) <= {OutboxState.DELIVERED, OutboxState.SUPERSEDED}


def test_a_status_is_posted_once_however_often_it_is_sent(idle_broker, forge_mission, git_repo, fake_forge):
    forge_mission()
    sha = git_repo.commit(GOOD)
    feature_admit(feature_id=hello().pk, trigger="manual", cause="validate")
    [row] = Outbox.objects.all()
    results = race(
        lambda: deliver(outbox_id=row.pk), lambda: deliver(outbox_id=row.pk), lambda: deliver(outbox_id=row.pk)
    )
    assert sorted(results) == ["delivered", "skipped", "skipped"]
    assert deliver(outbox_id=row.pk) == "skipped"
    assert len(fake_forge.statuses_of(sha)) == 1
    assert len(fake_forge.requests_to("POST")) == 1


def test_the_same_revision_judged_again_posts_no_state_twice(idle_broker, forge_mission, git_repo, fake_forge):
    forge_mission()
    sha = git_repo.commit(GOOD)
    run = feature_admit(feature_id=hello().pk, trigger="manual", cause="validate").run
    deliver_pending()
    execute_run(run.pk)
    deliver_pending()
    again = feature_admit(feature_id=hello().pk, trigger="manual", cause="validate")
    assert again.outcome == "reused"  # the same input: its pass, announced again
    assert deliver_pending() == []
    assert [s["state"] for s in fake_forge.statuses_of(sha)] == ["pending", "success"]
    assert sorted(Outbox.objects.values_list("key", flat=True)) == [f"status:{sha}:pending", f"status:{sha}:success"]


def test_a_revision_judged_passed_failed_passed_shows_its_last_verdict(
    idle_broker, forge_mission, git_repo, fake_forge
):
    """The forge shows a context's last status: the revision's last verdict is posted
    again after a different one, never left behind it."""
    forge = forge_mission()
    sha = git_repo.commit(GOOD)
    polite = ContractAssertion.objects.get(mission=forge.mission, key="POLITE")
    for check in (POLITE, {"file": "hello.py", "contains": "sorry"}, POLITE):
        ContractAssertion.objects.filter(pk=polite.pk).update(check_spec=check)
        run = rerun(feature_id=hello().pk, trigger="manual", cause="validate", revision=sha).run
        execute_run(run.pk)
        deliver_pending()
    # Each run's `pending` was not sent yet when its verdict came: superseded, never sent.
    assert [s["state"] for s in fake_forge.statuses_of(sha)] == ["success", "failure", "success"]


def test_an_older_status_never_lands_after_a_newer_one(idle_broker, forge_mission, git_repo, fake_forge):
    forge_mission()
    sha = git_repo.commit(GOOD)
    run = feature_admit(feature_id=hello().pk, trigger="manual", cause="validate").run
    execute_run(run.pk)  # the verdict before the start's status was sent
    pending, success = Outbox.objects.order_by("id")
    assert deliver(outbox_id=success.pk) == "delivered"
    assert deliver(outbox_id=pending.pk) == "skipped"
    pending.refresh_from_db()
    assert pending.state == OutboxState.SUPERSEDED and pending.last_error == f"superseded by {success.key}"
    assert [s["state"] for s in fake_forge.statuses_of(sha)] == ["success"]


def test_a_mission_without_a_forge_costs_a_run_one_query(
    idle_broker, forge_mission, git_repo, django_assert_num_queries
):
    from forges.services.arming import arm_run_ended, arm_run_started

    forge = forge_mission()
    git_repo.commit(GOOD)
    run = feature_admit(feature_id=hello().pk, trigger="manual", cause="validate").run
    forge.delete()
    with django_assert_num_queries(1):
        arm_run_started(run=run)
    run.status = RunStatus.PASSED
    with django_assert_num_queries(1):
        arm_run_ended(run=run)
