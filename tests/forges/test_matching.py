"""What a verified delivery does (docs/FORGES.md, "What is matched"): real pushes to a
`git daemon` repository, the forge's webhook for each, and the tasks they complete. The
worker's step is run here (`processed`), except in the first test, where a real worker
takes it from the queue."""

from __future__ import annotations

import pytest
from django.test import Client

from forges.models import Delivery, PullRequest
from missions.models import MissionEvent, Task
from missions.services.executor import result_branch
from missions.services.tasks import task_create
from tests.repos.conftest import feature, wait_for

from .conftest import github_pr, gitlab_mr, hook, processed, push_payload, tasks_of

pytestmark = pytest.mark.django_db(transaction=True)


def push_task_branch(served, task: Task, files: dict[str, str]) -> tuple[str, str]:
    """The agent commits and pushes to the task's executor branch: (ref, head)."""
    head = served.commit(files, f"work on task {task.pk}", push=False)
    ref = f"refs/heads/{result_branch(task)}"
    served.push(f"HEAD:{ref}")
    return ref, head


def test_a_push_to_a_task_branch_completes_that_task_at_the_pushed_head(worker, served, shop):
    task = task_create(user=None, feature=feature(shop, "f1"))
    ref, head = push_task_branch(served, task, {"f1.txt": "done f1\n"})

    answer = hook(Client(), shop, push_payload(ref, head))

    assert answer.status_code == 202
    delivery_id = answer.json()["delivery"]
    done = wait_for(lambda: Task.objects.filter(pk=task.pk, status="done").first(), message="the task done")
    assert done.revision == head
    delivery = wait_for(lambda: Delivery.objects.exclude(state="received").filter(pk=delivery_id).first())
    assert (delivery.state, delivery.task_id, delivery.ref, delivery.head) == ("matched", task.pk, ref, head)
    assert delivery.processed_at is not None
    worker.drain()
    event = MissionEvent.objects.get(mission=shop, type="forge-delivery:processed")
    assert event.payload["state"] == "matched" and event.payload["task"] == task.pk


def test_a_push_to_the_branch_of_a_task_of_no_feature_completes_it(served, shop, idle_broker):
    task = task_create(user=None, mission=shop, title="Tidy the README")
    ref, head = push_task_branch(served, task, {"README.md": "# shop, tidy\n"})
    assert ref == f"refs/heads/fusion/shop/task-{task.pk}"
    delivery = processed(hook(Client(), shop, push_payload(ref, head)))
    task.refresh_from_db()
    assert (delivery.state, task.status, task.revision) == ("matched", "done", head)


def test_pushes_that_name_no_task_of_the_mission_are_ignored_with_their_reason(served, shop, idle_broker, alice):
    client = Client()
    task = task_create(user=None, feature=feature(shop, "f1"))
    main = served.commit({"notes.txt": "n\n"}, "on main")
    wrong_feature = f"refs/heads/fusion/{shop.key}/f2-{task.pk}"  # the task is f1's
    other_mission = f"refs/heads/fusion/elsewhere/f1-{task.pk}"

    ignored = [
        processed(hook(client, shop, push_payload("refs/heads/main", main))),
        processed(hook(client, shop, push_payload(wrong_feature, main))),
        processed(hook(client, shop, push_payload(other_mission, main))),
        processed(hook(client, shop, push_payload(f"refs/heads/{result_branch(task)}", "0" * 40, before=main))),
        processed(hook(client, shop, {"action": "created", "issue": {"number": 3}}, event="issues")),
    ]

    assert [(d.state, d.reason) for d in ignored] == [
        ("ignored", "not a task branch"),
        ("ignored", "not a task branch"),
        ("ignored", "not a task branch"),
        ("ignored", "branch deleted"),
        ("ignored", "event issues is not followed"),
    ]
    task.refresh_from_db()
    assert task.status == "todo"


def test_a_refused_completion_is_a_failed_delivery_with_the_services_reason(served, shop, idle_broker):
    task = task_create(user=None, feature=feature(shop, "f1"))
    ref, first = push_task_branch(served, task, {"f1.txt": "done f1\n"})
    assert processed(hook(Client(), shop, push_payload(ref, first))).state == "matched"

    again = processed(hook(Client(), shop, push_payload(ref, first)))
    assert (again.state, again.reason) == ("ignored", "revision already judged")

    _, later = push_task_branch(served, task, {"f1.txt": "done f1, again\n"})
    failed = processed(hook(Client(), shop, push_payload(ref, later, before=first)))
    assert failed.state == "failed" and failed.reason == "the task is already done at another revision"
    task.refresh_from_db()
    assert task.revision == first


def test_a_pull_request_naming_a_feature_completes_its_task_creating_one(served, shop, idle_broker):
    head = served.commit({"f2.txt": "done f2\n"}, "f2", push=False)
    served.push("HEAD:refs/heads/agent/work")
    assert tasks_of(shop, "f2") == []

    delivery = processed(hook(Client(), shop, github_pr(7, "agent/work", "[F2] write f2", head), event="pull_request"))

    [task] = tasks_of(shop, "f2")
    assert (task.status, task.revision) == ("done", head)
    assert (delivery.state, delivery.task_id, delivery.pull_number, delivery.head) == ("matched", task.pk, 7, head)
    pr = PullRequest.objects.get(forge__mission=shop, number=7)
    assert (pr.feature_id, pr.branch, pr.title, pr.head) == (
        feature(shop, "f2").pk,
        "agent/work",
        "[F2] write f2",
        head,
    )
    assert pr.url == "https://github.com/acme/shop/pull/7"


def test_an_open_task_of_the_named_feature_is_the_one_completed(served, shop, idle_broker):
    open_task = task_create(user=None, feature=feature(shop, "f1"))
    head = served.commit({"f1.txt": "done f1\n"}, "f1")
    processed(hook(Client(), shop, github_pr(3, "feature/[f1]", "Implement", head), event="pull_request"))
    assert [(t.pk, t.status, t.revision) for t in tasks_of(shop, "f1")] == [(open_task.pk, "done", head)]


def test_a_pull_request_updated_twice_judges_each_head_with_a_task_of_its_own(served, shop, idle_broker):
    client = Client()
    heads = [served.commit({"f1.txt": f"attempt {n}\n"}, f"attempt {n}") for n in range(3)]
    states = []
    for n, (head, action) in enumerate(zip(heads, ("opened", "synchronize", "synchronize"), strict=True)):
        payload = github_pr(11, "agent/f1", "[f1] make f1", head, action=action)
        states.append(processed(hook(client, shop, payload, event="pull_request", delivery=f"pr-{n}")).state)
    # The same head delivered again under a new id (a title edit): already judged.
    edit = github_pr(
        11, "agent/f1", "[f1] make f1 better", heads[-1], action="edited", changes={"title": {"from": "x"}}
    )
    repeat = processed(hook(client, shop, edit, event="pull_request"))

    assert states == ["matched", "matched", "matched"]
    tasks = tasks_of(shop, "f1")
    assert [(t.status, t.revision) for t in tasks] == [("done", h) for h in heads]
    assert (repeat.state, repeat.reason, repeat.task_id) == ("ignored", "revision already judged", tasks[-1].pk)
    assert PullRequest.objects.get(number=11).title == "[f1] make f1 better"


def test_pull_request_events_that_name_no_feature_or_are_not_followed_are_ignored(served, shop, idle_broker):
    client = Client()
    head = served.commit({"x.txt": "x\n"}, "x")
    no_feature = processed(hook(client, shop, github_pr(4, "agent/x", "[nope] tidy up", head), event="pull_request"))
    closed = processed(hook(client, shop, github_pr(4, "agent/x", "[f1]", head, action="closed"), event="pull_request"))
    body_edit = github_pr(4, "agent/x", "[f1]", head, action="edited", changes={"body": {"from": ""}})
    edited = processed(hook(client, shop, body_edit, event="pull_request"))

    assert (no_feature.state, no_feature.reason) == (
        "ignored",
        "the pull request's branch and title name no feature of the mission",
    )
    assert PullRequest.objects.get(number=4).feature_id is None
    assert (closed.state, closed.reason) == ("ignored", "pull request action closed is not followed")
    assert (edited.state, edited.reason) == ("ignored", "pull request action edited is not followed")
    assert tasks_of(shop, "f1") == []


def test_a_feature_pattern_of_the_forge_names_features_in_branches(served, shop, idle_broker):
    shop.forge.feature_pattern = r"^agent/([a-z0-9-]+?)(?:--|$)"
    shop.forge.save()
    head = served.commit({"login.txt": "fixed\n"}, "fix login")
    delivery = processed(
        hook(Client(), shop, github_pr(5, "agent/FIX-LOGIN--try2", "No key here", head), event="pull_request")
    )
    assert delivery.state == "matched"
    assert [t.revision for t in tasks_of(shop, "fix-login")] == [head]


def test_gitlab_merge_request_updates_count_only_when_the_head_moved(served, shop, idle_broker):
    shop.forge.provider = "gitlab"
    shop.forge.save()
    client = Client()
    first = served.commit({"f2.txt": "one\n"}, "one")
    second = served.commit({"f2.txt": "two\n"}, "two")
    event = "Merge Request Hook"

    opened = processed(
        hook(client, shop, gitlab_mr(2, "f2-branch", "[f2] Draft", first), provider="gitlab", event=event)
    )
    retitled = processed(
        hook(client, shop, gitlab_mr(2, "f2-branch", "[f2] Ready", first, "update"), provider="gitlab", event=event)
    )
    pushed = processed(
        hook(
            client,
            shop,
            gitlab_mr(2, "f2-branch", "[f2] Ready", second, "update", oldrev=first),
            provider="gitlab",
            event=event,
        )
    )

    assert opened.state == "matched"
    assert (retitled.state, retitled.reason) == ("ignored", "the merge request's head did not move")
    assert pushed.state == "matched"
    assert [t.revision for t in tasks_of(shop, "f2")] == [first, second]


def test_gitea_and_generic_forms_are_matched_alike(served, shop, idle_broker):
    client = Client()
    task = task_create(user=None, feature=feature(shop, "f1"))
    ref, head = push_task_branch(served, task, {"f1.txt": "done f1\n"})
    shop.forge.provider = "generic"
    shop.forge.save()
    generic = processed(hook(client, shop, {"ref": ref, "after": head}, provider="generic", event="push"))
    assert generic.state == "matched"

    shop.forge.provider = "gitea"
    shop.forge.save()
    f2 = served.commit({"f2.txt": "done f2\n"}, "f2")
    gitea = github_pr(9, "agent/f2", "[f2] write", f2, action="synchronized")
    assert processed(hook(client, shop, gitea, provider="gitea", event="pull_request")).state == "matched"
    assert [t.revision for t in tasks_of(shop, "f2")] == [f2]


def test_a_delivery_is_processed_once(served, shop, idle_broker):
    from forges.inbound.process import delivery_process

    head = served.commit({"f1.txt": "done f1\n"}, "f1")
    delivery = processed(hook(Client(), shop, github_pr(1, "b", "[f1]", head), event="pull_request"))
    assert delivery_process(delivery_id=delivery.pk) is None  # a message delivered twice
    assert len(tasks_of(shop, "f1")) == 1
    assert MissionEvent.objects.filter(mission=shop, type="forge-delivery:processed").count() == 1


def test_a_delivery_whose_message_was_lost_is_matched_by_the_recovery_sweep(worker, served, shop, monkeypatch):
    from forges.inbound import receive
    from validation.services.recovery import recover

    task = task_create(user=None, feature=feature(shop, "f2"))
    ref, head = push_task_branch(served, task, {"f2.txt": "done f2\n"})
    with monkeypatch.context() as lost:  # the process dies between its commit and its send
        lost.setattr(receive, "send_on_commit", lambda *args, **kwargs: None)
        answer = hook(Client(), shop, push_payload(ref, head))
    assert answer.status_code == 202
    delivery_id = answer.json()["delivery"]
    assert Delivery.objects.get(pk=delivery_id).state == "received"

    report = recover()

    assert report["forge_deliveries_redriven"] == [delivery_id]
    delivery = wait_for(lambda: Delivery.objects.filter(pk=delivery_id, state="matched").first())
    assert delivery.task_id == task.pk
    task.refresh_from_db()
    assert (task.status, task.revision) == ("done", head)
    worker.drain()
    assert recover()["forge_deliveries_redriven"] == []
