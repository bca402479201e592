"""A followed pull request gets one comment, created at its first verdict and edited (never
posted again) at each next one: the verdict per assertion, the failures' expected, actual
and evidence, the fix feature's "Validation cause", a link to the run."""

from __future__ import annotations

import pytest
from django.conf import settings

from forges.models import Outbox, OutboxKind, OutboxState, PullRequest
from forges.services import delivery
from forges.services.arming import arm_comment
from forges.services.delivery import deliver
from missions.models import MissionFeature
from tests.forges.conftest import BAD, GOOD, RUDE, follow_pull
from validation.models import FixLineage, RunStatus, ValidatorRun
from validation.services.runner import execute_run
from validation.services.verdicts.admit import feature_admit

pytestmark = pytest.mark.django_db(transaction=True)


def hello() -> MissionFeature:
    return MissionFeature.objects.get(key="hello")


def judge(git_repo, files: dict[str, str]) -> ValidatorRun:
    """A new head judged through the loop's own steps, then the outbox sent."""
    git_repo.commit(files)
    admission = feature_admit(feature_id=hello().pk, trigger="manual", cause="validate")
    assert admission.outcome == "started", admission
    send_outbox()
    execute_run(admission.run.pk)
    send_outbox()
    admission.run.refresh_from_db()
    return admission.run


def send_outbox() -> None:
    for pk in Outbox.objects.filter(state=OutboxState.PENDING).order_by("id").values_list("pk", flat=True):
        deliver(outbox_id=pk)


def comment_rows() -> list[Outbox]:
    return list(Outbox.objects.filter(kind=OutboxKind.COMMENT))


def test_three_verdicts_make_one_comment_edited_twice(idle_broker, forge_mission, git_repo, fake_forge):
    forge = forge_mission()
    pull = follow_pull(forge)
    runs = [judge(git_repo, files) for files in (BAD, RUDE, GOOD)]
    assert [r.status for r in runs] == [RunStatus.FAILED, RunStatus.FAILED, RunStatus.PASSED]
    creates = fake_forge.requests_to("POST", "/issues/7/comments")
    edits = fake_forge.requests_to("PATCH", "/issues/comments/")
    assert len(creates) == 1 and len(edits) == 2
    [(comment_id, comment)] = fake_forge.comments.items()
    pull.refresh_from_db()
    assert pull.comment_id == str(comment_id)
    assert all(e.path == f"/repos/acme/shop/issues/comments/{comment_id}" for e in edits)
    body = comment["body"]
    assert f"`hello` ✅ passed at `{runs[-1].revision[:12]}`" in body
    assert "2/2 assertions passed" in body and f"{settings.FUSION_PUBLIC_URL}/runs/{runs[-1].pk}/" in body
    assert "| ✅ | `GREET`" in body and "| ✅ | `POLITE`" in body
    [row] = comment_rows()
    assert (row.key, row.state, row.version, row.delivered_version) == ("comment:7", "delivered", 3, 3)
    # and each head got its statuses
    for run, state in zip(runs, ("failure", "failure", "success"), strict=True):
        assert [s["state"] for s in fake_forge.statuses_of(run.revision)] == ["pending", state]


def test_a_failure_shows_expected_actual_and_evidence(idle_broker, forge_mission, git_repo, fake_forge):
    follow_pull(forge_mission())
    run = judge(git_repo, RUDE)
    [comment] = fake_forge.comments.values()
    body = comment["body"]
    assert f"`hello` ❌ failed at `{run.revision[:12]}`" in body and "1/2 assertions passed" in body
    assert "| ✅ | `GREET`" in body and "| ❌ | `POLITE`" in body
    failure = run.failures.get()
    assert "#### ❌ `POLITE`" in body
    assert f"- **expected:** {' '.join(failure.expected.split())[:80]}" in body
    assert "- **actual:**" in body
    if failure.evidence:
        assert "<details><summary>evidence" in body


def test_the_fix_features_validation_cause_is_in_the_comment(idle_broker, forge_mission, git_repo, fake_forge):
    follow_pull(forge_mission(auto_fix=True))
    run = judge(git_repo, RUDE)
    lineage = FixLineage.objects.get(run=run)
    body = next(iter(fake_forge.comments.values()))["body"]
    assert f"### Fix feature `{lineage.fix.key}`" in body
    assert "#### Validation cause" in body
    assert f"Validator run {run.pk} (revision `{run.revision[:12]}`) failed:" in body
    assert "### POLITE" in body  # the cause names the failed assertion, as the fix feature's description does


def test_a_comment_rearmed_while_it_is_sent_stays_pending(
    idle_broker, forge_mission, git_repo, fake_forge, monkeypatch
):
    forge = forge_mission()
    pull = follow_pull(forge)
    first = judge(git_repo, RUDE)
    [row] = comment_rows()
    arm_comment(forge_id=forge.pk, pull=pull, run_id=first.pk)  # armed again, then a newer verdict while sending
    send = delivery.send

    def newer_verdict_meanwhile(request, **kwargs):
        arm_comment(forge_id=forge.pk, pull=pull, run_id=first.pk)
        return send(request, **kwargs)

    monkeypatch.setattr(delivery, "send", newer_verdict_meanwhile)
    assert deliver(outbox_id=row.pk) == "delivered"
    row.refresh_from_db()
    assert (row.state, row.version, row.delivered_version) == (OutboxState.PENDING, 3, 2)
    monkeypatch.setattr(delivery, "send", send)
    assert deliver(outbox_id=row.pk) == "delivered"
    row.refresh_from_db()
    assert (row.state, row.delivered_version) == (OutboxState.DELIVERED, 3)
    assert len(fake_forge.requests_to("POST", "/comments")) == 1 and len(fake_forge.comments) == 1


def test_a_comment_a_person_deleted_is_posted_again(idle_broker, forge_mission, git_repo, fake_forge):
    forge = forge_mission()
    pull = follow_pull(forge)
    judge(git_repo, RUDE)
    fake_forge.comments.clear()
    judge(git_repo, GOOD)
    assert len(fake_forge.requests_to("POST", "/comments")) == 2
    [(comment_id, _)] = fake_forge.comments.items()
    pull.refresh_from_db()
    assert pull.comment_id == str(comment_id)


def test_a_gitlab_merge_request_gets_one_note_edited(idle_broker, forge_mission, git_repo, fake_forge):
    forge = forge_mission(provider="gitlab")
    follow_pull(forge, number=3)
    judge(git_repo, RUDE)
    last = judge(git_repo, GOOD)
    [create] = fake_forge.requests_to("POST", "/notes")
    [edit] = fake_forge.requests_to("PUT", "/notes/")
    assert create.path == "/projects/acme%2Fshop/merge_requests/3/notes"
    [(note_id, note)] = fake_forge.comments.items()
    assert edit.path == f"/projects/acme%2Fshop/merge_requests/3/notes/{note_id}"
    assert "✅ passed" in note["body"]
    assert [s["state"] for s in fake_forge.statuses_of(last.revision)] == ["running", "success"]
    assert PullRequest.objects.get(number=3).comment_id == str(note_id)


def test_a_pull_request_whose_head_was_judged_is_answered(idle_broker, forge_mission, git_repo, fake_forge):
    forge = forge_mission()
    sha = git_repo.commit(RUDE)
    PullRequest.objects.create(forge=forge, number=9, head=sha, branch="other")  # names no feature
    feature_admit(feature_id=hello().pk, trigger="manual", cause="validate")
    run = ValidatorRun.objects.get()
    execute_run(run.pk)
    [row] = comment_rows()
    assert row.key == "comment:9"
    assert deliver(outbox_id=row.pk) == "delivered"
    assert fake_forge.requests_to("POST", "/issues/9/comments")


def test_no_comment_when_the_forge_says_so(idle_broker, forge_mission, git_repo, fake_forge):
    follow_pull(forge_mission(comments=False))
    judge(git_repo, RUDE)
    assert comment_rows() == [] and fake_forge.comments == {}
    assert fake_forge.statuses


def test_no_comment_for_a_run_that_did_not_judge(idle_broker, forge_mission, git_repo, fake_forge):
    from validation.services.verdicts.complete import run_error

    follow_pull(forge_mission())
    git_repo.commit(BAD)
    run = feature_admit(feature_id=hello().pk, trigger="manual", cause="validate").run
    run_error(run_id=run.pk, message="the validator crashed", retry=False)
    assert comment_rows() == []
    error = Outbox.objects.get(key=f"status:{run.revision}:error")
    assert error.payload["description"] == "Not judged (validator error): validator_error"


def test_a_pull_request_updated_three_times_through_the_loop(worker, forge_mission, git_repo, fake_forge, alice):
    from missions.services.tasks import task_complete, task_create

    forge = forge_mission()
    pull = follow_pull(forge)
    heads = []
    for files in (BAD, RUDE, GOOD):
        head = git_repo.commit(files)
        heads.append(head)
        PullRequest.objects.filter(pk=pull.pk).update(head=head)
        task_complete(user=alice, task=task_create(user=alice, feature=hello()), revision=head)
        worker.drain()
    runs = list(ValidatorRun.objects.order_by("id"))
    assert [(r.revision, r.status) for r in runs] == list(
        zip(heads, [RunStatus.FAILED, RunStatus.FAILED, RunStatus.PASSED], strict=True)
    )
    assert len(fake_forge.requests_to("POST", "/issues/7/comments")) == 1
    assert len(fake_forge.requests_to("PATCH", "/issues/comments/")) == 2
    [comment] = fake_forge.comments.values()
    assert f"✅ passed at `{heads[-1][:12]}`" in comment["body"]
    for head, state in zip(heads, ("failure", "failure", "success"), strict=True):
        assert [s["state"] for s in fake_forge.statuses_of(head)][-1] == state


def test_what_the_outbox_holds_commits_with_the_run_or_not_at_all(idle_broker, forge_mission, git_repo, fake_forge):
    from django.db import transaction

    follow_pull(forge_mission())
    git_repo.commit(RUDE)
    with pytest.raises(RuntimeError), transaction.atomic():
        feature_admit(feature_id=hello().pk, trigger="manual", cause="validate")
        assert Outbox.objects.count() == 1  # written in the run's own transaction…
        raise RuntimeError("the start is rolled back")
    assert Outbox.objects.count() == 0  # …and gone with it
    assert not ValidatorRun.objects.exists()


def test_a_gitea_pull_request_gets_one_comment_edited(idle_broker, forge_mission, git_repo, fake_forge):
    follow_pull(forge_mission(provider="gitea"), number=4)
    judge(git_repo, RUDE)
    judge(git_repo, GOOD)
    [create] = fake_forge.requests_to("POST", "/comments")
    [edit] = fake_forge.requests_to("PATCH", "/comments/")
    [(comment_id, comment)] = fake_forge.comments.items()
    assert create.path == "/repos/acme/shop/issues/4/comments"
    assert edit.path == f"/repos/acme/shop/issues/comments/{comment_id}"
    assert "✅ passed" in comment["body"]


def test_a_comment_created_by_a_worker_that_died_before_recording_it_is_not_posted_again(
    idle_broker, forge_mission, git_repo, fake_forge, monkeypatch
):
    from datetime import timedelta

    from django.utils import timezone

    pull = follow_pull(forge_mission())
    git_repo.commit(RUDE)
    run = feature_admit(feature_id=hello().pk, trigger="manual", cause="validate").run
    execute_run(run.pk)
    [row] = comment_rows()

    send = delivery.send

    def killed_after_the_forge_answered(request, **kwargs):
        send(request, **kwargs)
        raise SystemExit("the worker was killed")

    monkeypatch.setattr(delivery, "send", killed_after_the_forge_answered)
    with pytest.raises(SystemExit):
        deliver(outbox_id=row.pk)
    monkeypatch.undo()
    assert len(fake_forge.comments) == 1
    pull.refresh_from_db()
    assert pull.comment_id == ""  # the forge has it; the database never heard

    later = timezone.now() + timedelta(seconds=61)  # its claim has expired
    assert deliver(outbox_id=row.pk, now=later) == "delivered"
    assert len(fake_forge.requests_to("POST", "/comments")) == 1
    assert len(fake_forge.requests_to("GET", "/issues/7/comments")) == 1
    [(comment_id, _)] = fake_forge.comments.items()
    assert len(fake_forge.requests_to("PATCH", f"/issues/comments/{comment_id}")) == 1
    pull.refresh_from_db()
    assert pull.comment_id == str(comment_id)
