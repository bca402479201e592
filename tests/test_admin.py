"""The Django admin: every page answers, state stays read-only, links are validated and
the milestone rollup follows admin edits."""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from missions.models import (
    AssertionScope,
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    RollupState,
    Slice,
    Task,
    TaskStatus,
)
from missions.outbox import publish_on_commit
from validation.models import (
    FixLineage,
    JournalEntry,
    Review,
    ReviewArtifact,
    ValidatorFailure,
    ValidatorRun,
)

pytestmark = pytest.mark.django_db

ADDABLE = {
    "missions.mission",
    "missions.milestone",
    "missions.slice",
    "missions.missionfeature",
    "missions.contractassertion",
    "missions.featureassertion",
    "missions.task",
}
READ_ONLY = {
    "missions.missionevent",
    "validation.validatorrun",
    "validation.validatorfailure",
    "validation.fixlineage",
    "validation.journalentry",
    "validation.review",
    "validation.reviewartifact",
}
ALL_MODELS = sorted(ADDABLE | READ_ONLY)


def url(obj_or_label: Any, view: str = "change") -> str:
    if isinstance(obj_or_label, str):
        app_label, model_name = obj_or_label.split(".")
        return reverse(f"admin:{app_label}_{model_name}_{view}")
    opts = obj_or_label._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=[obj_or_label.pk])


def make_slice(milestone: Milestone, key: str) -> Slice:
    obj = Slice(milestone=milestone, key=key, title=key.upper())
    obj.save()
    return obj


def make_feature(slice_: Slice, key: str, **extra: Any) -> MissionFeature:
    obj = MissionFeature(slice=slice_, key=key, title=key.upper(), **extra)
    obj.save()
    return obj


def make_assertion(milestone: Milestone, key: str, scope: str = AssertionScope.FEATURE) -> ContractAssertion:
    obj = ContractAssertion(milestone=milestone, key=key, title=key, statement=f"{key} holds", scope=scope)
    obj.save()
    return obj


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def world(admin_user) -> dict[str, Any]:
    mission = Mission.objects.create(key="m", title="M", owner=admin_user)
    milestone = Milestone.objects.create(mission=mission, key="ms", title="MS")
    slice_ = make_slice(milestone, "sl")
    feature = make_feature(slice_, "f")
    assertion = make_assertion(milestone, "VAL-1")
    milestone_assertion = make_assertion(milestone, "VAL-M", AssertionScope.MILESTONE)
    link = FeatureAssertion.objects.create(feature=feature, assertion=assertion)
    task = Task.objects.create(mission=mission, feature=feature, title="T", status=TaskStatus.DONE)
    event = publish_on_commit(mission, "mission:created", {"mission": mission.pk, "status": mission.status})
    run = ValidatorRun.objects.create(
        mission=mission,
        feature=feature,
        milestone=milestone,
        status="failed",
        tokens_in=12,
        tokens_out=34,
        verdict={"status": "failed", "assertions": [{"id": "VAL-1", "status": "fail"}]},
    )
    fix = make_feature(slice_, "f-fix-1", generated_from=feature, generated_from_run=run)
    feature.last_run = run
    feature.save()
    failure = ValidatorFailure.objects.create(
        run=run,
        feature=feature,
        assertion=assertion,
        assertion_key="VAL-1",
        message="broken",
        evidence=[{"kind": "log", "text": "<b>boom</b>"}],
    )
    lineage = FixLineage.objects.create(root=feature, source=feature, fix=fix, run=run)
    lineage.failed_assertions.add(assertion)
    journal = JournalEntry.objects.create(
        run=run, seq=1, kind="check", key="call-1", payload={"x": 1}, sha256="ab" * 32
    )
    review = Review.objects.create(mission=mission, feature=feature, request={"q": 1})
    artifact = ReviewArtifact.objects.create(
        review=review, kind="markdown", name="report.md", content="# report", byte_length=8, sha256="cd" * 32
    )
    objects = {
        "missions.mission": mission,
        "missions.milestone": milestone,
        "missions.slice": slice_,
        "missions.missionfeature": feature,
        "missions.contractassertion": assertion,
        "missions.featureassertion": link,
        "missions.task": task,
        "missions.missionevent": event,
        "validation.validatorrun": run,
        "validation.validatorfailure": failure,
        "validation.fixlineage": lineage,
        "validation.journalentry": journal,
        "validation.review": review,
        "validation.reviewartifact": artifact,
    }
    return {**objects, "fix": fix, "milestone_assertion": milestone_assertion}


def form_data(response) -> dict[str, Any]:
    """The POST body the change form would send unchanged (main form and inlines)."""
    data: dict[str, Any] = {}

    def add_form(form) -> None:
        for name in form.fields:
            value = form[name].value()
            if value is None or value is False:
                continue
            data[form.add_prefix(name)] = "on" if value is True else value

    add_form(response.context["adminform"].form)
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        add_form(formset.management_form)
        for form in formset.forms:
            add_form(form)
    return data


def add_inline_row(data: dict[str, Any], prefix: str, **fields: Any) -> None:
    index = int(data[f"{prefix}-TOTAL_FORMS"])
    data[f"{prefix}-TOTAL_FORMS"] = str(index + 1)
    for name, value in fields.items():
        data[f"{prefix}-{index}-{name}"] = value


def staff_user(username: str, *perms: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return user


# --- every page answers ---------------------------------------------------------------------


def test_every_model_of_both_apps_is_registered():
    registered = {
        f"{model._meta.app_label}.{model._meta.model_name}"
        for model in apps.get_models()
        if model._meta.app_label in ("missions", "validation")
    }
    assert registered == set(ALL_MODELS)
    for label in ALL_MODELS:
        assert admin.site.is_registered(apps.get_model(label))


@pytest.mark.parametrize("label", ALL_MODELS)
def test_changelist_answers(admin_client, world, label):
    response = admin_client.get(url(label, "changelist"))
    assert response.status_code == 200
    assert response.context["cl"].result_count >= 1
    assert admin_client.get(url(label, "changelist"), {"q": "x"}).status_code == 200


@pytest.mark.parametrize("label", ALL_MODELS)
def test_add_page_answers_where_adding_is_allowed(admin_client, world, label):
    response = admin_client.get(url(label, "add"))
    assert response.status_code == (200 if label in ADDABLE else 403)


@pytest.mark.parametrize("label", ALL_MODELS)
def test_change_page_answers(admin_client, world, label):
    response = admin_client.get(url(world[label]))
    assert response.status_code == 200
    saves = 'name="_save"' in response.content.decode()
    assert saves == (label in ADDABLE)


def test_non_staff_user_is_sent_to_login(client, world):
    client.force_login(User.objects.create_user("plain", password="pw"))
    for target in (
        reverse("admin:index"),
        url("missions.mission", "changelist"),
        url(world["missions.missionfeature"]),
    ):
        response = client.get(target)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))


def test_anonymous_user_is_sent_to_login(client, world):
    response = client.get(url("validation.validatorrun", "changelist"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


# --- contents and links ------------------------------------------------------------------------


def test_feature_page_links_its_relatives(admin_client, world):
    feature, run = world["missions.missionfeature"], world["validation.validatorrun"]
    body = admin_client.get(url(world["fix"])).content.decode()
    assert f'href="{url(feature)}"' in body  # generated_from
    assert f'href="{url(run)}"' in body  # generated_from_run
    body = admin_client.get(url(feature)).content.decode()
    for obj in (
        world["missions.slice"],
        world["missions.milestone"],
        world["missions.mission"],
        run,
        world["missions.contractassertion"],
        world["missions.task"],
    ):
        assert f'href="{url(obj)}"' in body


def test_run_page_shows_verdict_failures_journal_and_tokens(admin_client, world):
    body = admin_client.get(url(world["validation.validatorrun"])).content.decode()
    assert "<pre" in body and "&quot;assertions&quot;" in body
    assert "broken" in body  # failure inline
    assert "call-1" in body and "abababababab" in body and "ab" * 32 not in body  # journal, short sha
    assert ">12<" in body and ">34<" in body
    assert f'href="{url(world["validation.journalentry"])}"' in body


def test_failure_evidence_is_escaped(admin_client, world):
    body = admin_client.get(url(world["validation.validatorfailure"])).content.decode()
    assert "&lt;b&gt;boom&lt;/b&gt;" in body and "<b>boom</b>" not in body


def test_review_page_lists_artifacts(admin_client, world):
    body = admin_client.get(url(world["validation.review"])).content.decode()
    assert "report.md" in body and "markdown" in body and "cd" * 32 in body


# --- read-only state ---------------------------------------------------------------------------


def test_state_fields_are_not_editable(admin_client, world):
    feature = world["missions.missionfeature"]
    response = admin_client.get(url(feature))
    form = response.context["adminform"].form
    for name in (
        "status",
        "loop_state",
        "implementation_attempts",
        "validator_attempts",
        "fix_rounds",
        "last_run",
        "stop_reason",
        "stop_detail",
        "stopped_at",
        "generated_from",
        "generated_from_run",
        "mission",
    ):
        assert name not in form.fields
    data = form_data(response)
    data.update(title="Renamed", status="done", loop_state="passed", fix_rounds="9")
    assert admin_client.post(url(feature), data).status_code == 302
    feature.refresh_from_db()
    assert (feature.title, feature.status, feature.loop_state, feature.fix_rounds) == ("Renamed", "defined", "idle", 0)


@pytest.mark.parametrize(
    ("label", "fields"),
    [
        ("missions.mission", {"status"}),
        ("missions.milestone", {"status", "validation_state", "mission"}),
        ("missions.slice", {"status", "activated_at", "mission"}),
        ("missions.contractassertion", {"status", "mission"}),
        ("missions.task", {"status", "revision", "started_at", "finished_at"}),
    ],
)
def test_other_state_fields_are_read_only(admin_client, world, label, fields):
    form = admin_client.get(url(world[label])).context["adminform"].form
    assert not fields & set(form.fields)


def test_records_cannot_be_changed_and_audit_log_not_deleted(admin_client, world):
    event = world["missions.missionevent"]
    assert admin_client.post(url(event), {"type": "x"}).status_code == 403
    assert admin_client.get(url(event, "delete")).status_code == 403
    run = world["validation.validatorrun"]
    assert admin_client.post(url(run), {"summary": "x"}).status_code == 403


def test_records_are_deleted_by_superusers_only(client, admin_client, world):
    run = world["validation.validatorrun"]
    client.force_login(staff_user("ops", "validation.view_validatorrun", "validation.delete_validatorrun"))
    assert client.get(url(run)).status_code == 200
    assert client.get(url(run, "delete")).status_code == 403
    assert admin_client.post(url(run, "delete"), {"post": "yes"}).status_code == 302
    assert not ValidatorRun.objects.filter(pk=run.pk).exists()
    assert not JournalEntry.objects.exists() and not ValidatorFailure.objects.exists()


def test_check_spec_is_editable_only_with_mission_change_permission(client, admin_client, world):
    assertion = world["missions.contractassertion"]
    assert "check_spec" in admin_client.get(url(assertion)).context["adminform"].form.fields
    client.force_login(staff_user("editor", "missions.view_contractassertion", "missions.change_contractassertion"))
    response = client.get(url(assertion))
    assert response.status_code == 200
    assert "check_spec" not in response.context["adminform"].form.fields


def test_mission_deletion_takes_its_audit_log(admin_client, world):
    mission = world["missions.mission"]
    response = admin_client.get(url(mission, "delete"))
    assert response.status_code == 200 and not response.context["perms_lacking"]
    assert admin_client.post(url(mission, "delete"), {"post": "yes"}).status_code == 302
    assert not Mission.objects.exists() and not MissionEvent.objects.exists()


def test_feature_with_running_task_cannot_be_deleted(admin_client, world):
    feature = world["missions.missionfeature"]
    Task.objects.filter(feature=feature).update(status=TaskStatus.IN_PROGRESS)
    assert admin_client.get(url(feature, "delete")).status_code == 403
    assert admin_client.get(url(world["missions.slice"], "delete")).context["perms_lacking"]


# --- links and the rollup ------------------------------------------------------------------------


def test_linking_a_milestone_scoped_assertion_is_refused(admin_client, world):
    feature, refused = world["missions.missionfeature"], world["milestone_assertion"]
    links, events = FeatureAssertion.objects.count(), MissionEvent.objects.count()
    data = form_data(admin_client.get(url(feature)))
    add_inline_row(data, "assertion_links", feature=feature.pk, assertion=refused.pk)
    response = admin_client.post(url(feature), data)
    assert response.status_code == 200
    assert "Milestone-scoped assertions cannot be linked to features." in response.content.decode()
    assert FeatureAssertion.objects.count() == links and MissionEvent.objects.count() == events
    assert not FeatureAssertion.objects.filter(assertion=refused).exists()


def test_standalone_link_form_reports_missing_fields(admin_client, world):
    response = admin_client.post(url("missions.featureassertion", "add"), {})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors.keys() == {"feature", "assertion"}


def test_linking_from_the_feature_recomputes_the_rollup(admin_client, world):
    feature, milestone = world["missions.missionfeature"], world["missions.milestone"]
    extra = make_assertion(milestone, "VAL-2")
    data = form_data(admin_client.get(url(feature)))
    add_inline_row(data, "assertion_links", feature=feature.pk, assertion=extra.pk)
    assert admin_client.post(url(feature), data).status_code == 302
    assert FeatureAssertion.objects.filter(feature=feature, assertion=extra).exists()
    milestone.refresh_from_db()
    assert milestone.validation_state == RollupState.READY
    assert MissionEvent.objects.filter(type="milestone:validation:updated").exists()


def test_unlinking_from_the_assertion_recomputes_the_rollup(admin_client, world):
    assertion, milestone = world["missions.contractassertion"], world["missions.milestone"]
    data = form_data(admin_client.get(url(assertion)))
    data["feature_links-0-DELETE"] = "on"
    assert admin_client.post(url(assertion), data).status_code == 302
    assert not FeatureAssertion.objects.exists()
    milestone.refresh_from_db()
    assert milestone.validation_state == RollupState.NEEDS_COVERAGE


def test_adding_an_assertion_recomputes_the_rollup(admin_client, world):
    milestone = world["missions.milestone"]
    response = admin_client.post(
        url("missions.contractassertion", "add"),
        {
            "milestone": milestone.pk,
            "key": "VAL-3",
            "title": "three",
            "statement": "s",
            "scope": "feature",
            "order": "0",
            "feature_links-TOTAL_FORMS": "0",
            "feature_links-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302
    new = ContractAssertion.objects.get(key="VAL-3")
    assert new.mission_id == milestone.mission_id and new.status == "pending"
    milestone.refresh_from_db()
    assert milestone.validation_state == RollupState.NEEDS_COVERAGE


def test_deleting_assertions_recomputes_the_rollup(admin_client, world):
    milestone = world["missions.milestone"]
    response = admin_client.post(
        url("missions.contractassertion", "changelist"),
        {
            "action": "delete_selected",
            "post": "yes",
            admin.helpers.ACTION_CHECKBOX_NAME: [a.pk for a in ContractAssertion.objects.all()],
        },
    )
    assert response.status_code == 302
    assert not ContractAssertion.objects.exists()
    milestone.refresh_from_db()
    assert milestone.validation_state == RollupState.NOT_STARTED


def test_deleting_a_linked_feature_recomputes_the_rollup(admin_client, world):
    milestone = world["missions.milestone"]
    milestone.validation_state = RollupState.READY
    milestone.save()
    assert admin_client.post(url(world["missions.missionfeature"], "delete"), {"post": "yes"}).status_code == 302
    milestone.refresh_from_db()
    assert milestone.validation_state == RollupState.NEEDS_COVERAGE


def test_feature_choices_are_limited_to_the_mission(admin_client, world):
    other = Mission.objects.create(key="other", title="O")
    foreign = make_assertion(Milestone.objects.create(mission=other, key="ms", title="MS"), "VAL-X")
    response = admin_client.get(url(world["missions.missionfeature"]))
    formset = next(i.formset for i in response.context["inline_admin_formsets"] if i.formset.model is FeatureAssertion)
    choices = formset.forms[0].fields["assertion"].queryset
    assert world["missions.contractassertion"] in choices and foreign not in choices


# --- derived mission and keys --------------------------------------------------------------------


def test_duplicate_keys_are_form_errors(admin_client, world):
    milestone = world["missions.milestone"]
    data = form_data(admin_client.get(url(milestone)))
    add_inline_row(data, "slices", milestone=milestone.pk, key="sl", title="dup", order="0")
    response = admin_client.post(url(milestone), data)
    assert response.status_code == 200 and "already used in the mission" in response.content.decode()
    data = form_data(admin_client.get(url(milestone)))
    add_inline_row(data, "slices", milestone=milestone.pk, key="new", title="a", order="0")
    add_inline_row(data, "slices", milestone=milestone.pk, key="new", title="b", order="0")
    response = admin_client.post(url(milestone), data)
    assert response.status_code == 200 and "appears twice" in response.content.decode()
    assert Slice.objects.count() == 1


def test_slice_added_inline_derives_its_mission(admin_client, world):
    milestone = world["missions.milestone"]
    data = form_data(admin_client.get(url(milestone)))
    add_inline_row(data, "slices", milestone=milestone.pk, key="sl-2", title="two", order="1")
    assert admin_client.post(url(milestone), data).status_code == 302
    assert Slice.objects.get(key="sl-2").mission_id == milestone.mission_id


def test_feature_cannot_move_to_another_mission(admin_client, world):
    other = Mission.objects.create(key="other", title="O")
    foreign_slice = make_slice(Milestone.objects.create(mission=other, key="ms", title="MS"), "sl")
    feature = world["missions.missionfeature"]
    data = form_data(admin_client.get(url(feature)))
    data["slice"] = foreign_slice.pk
    response = admin_client.post(url(feature), data)
    assert response.status_code == 200 and "Cannot move to another mission." in response.content.decode()


def test_task_feature_must_belong_to_the_mission(admin_client, world):
    other = Mission.objects.create(key="other", title="O")
    response = admin_client.post(
        url("missions.task", "add"),
        {
            "mission": other.pk,
            "feature": world["missions.missionfeature"].pk,
            "title": "t",
            "executor": "manual",
        },
    )
    assert response.status_code == 200 and "belongs to another mission" in response.content.decode()
    assert Task.objects.count() == 1


def test_feature_added_with_links_in_one_submit(admin_client, world):
    slice_, assertion = world["missions.slice"], world["missions.contractassertion"]
    data = form_data(admin_client.get(url("missions.missionfeature", "add")))
    data.update(slice=slice_.pk, key="g", title="G", order="0")
    add_inline_row(data, "assertion_links", assertion=assertion.pk)
    response = admin_client.post(url("missions.missionfeature", "add"), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    feature = MissionFeature.objects.get(key="g")
    assert feature.mission_id == slice_.mission_id
    assert list(feature.assertions.all()) == [assertion]


def test_assertion_added_with_links_in_one_submit(admin_client, world):
    milestone, feature = world["missions.milestone"], world["missions.missionfeature"]
    data = form_data(admin_client.get(url("missions.contractassertion", "add")))
    data.update(milestone=milestone.pk, key="VAL-9", title="nine", statement="s", scope="feature", order="0")
    add_inline_row(data, "feature_links", feature=feature.pk)
    assert admin_client.post(url("missions.contractassertion", "add"), data).status_code == 302
    assert FeatureAssertion.objects.filter(assertion__key="VAL-9", feature=feature).exists()
    milestone.refresh_from_db()
    assert milestone.validation_state == RollupState.READY


def test_slice_added_with_features_in_one_submit(admin_client, world):
    milestone = world["missions.milestone"]
    data = form_data(admin_client.get(url("missions.slice", "add")))
    data.update(milestone=milestone.pk, key="sl-3", title="three", order="0")
    add_inline_row(data, "features", key="f-3", title="F3", order="0")
    add_inline_row(data, "features", key="f", title="taken", order="0")
    response = admin_client.post(url("missions.slice", "add"), data)
    assert response.status_code == 200 and "already used in the mission" in response.content.decode()
    data["features-TOTAL_FORMS"] = "1"
    assert admin_client.post(url("missions.slice", "add"), data).status_code == 302
    assert MissionFeature.objects.get(key="f-3").mission_id == milestone.mission_id


def test_milestone_added_and_key_checked_on_change(admin_client, world):
    mission = world["missions.mission"]
    data = form_data(admin_client.get(url("missions.milestone", "add")))
    data.update(mission=mission.pk, key="ms-2", title="two", order="1")
    assert admin_client.post(url("missions.milestone", "add"), data).status_code == 302
    second = Milestone.objects.get(key="ms-2")
    data = form_data(admin_client.get(url(second)))
    data["key"] = "ms"
    response = admin_client.post(url(second), data)
    assert response.status_code == 200 and "already used in the mission" in response.content.decode()


def test_scope_change_to_milestone_needs_unlinked_assertion(admin_client, world):
    assertion = world["missions.contractassertion"]
    data = form_data(admin_client.get(url(assertion)))
    data["scope"] = "milestone"
    response = admin_client.post(url(assertion), data)
    assert response.status_code == 200 and "Remove the feature links first" in response.content.decode()
    assertion.refresh_from_db()
    assert assertion.scope == "feature"


def test_milestone_dependency_cycle_is_a_form_error(admin_client, world):
    first = world["missions.milestone"]
    second = Milestone.objects.create(mission=first.mission, key="ms-2", title="two")
    second.dependencies.add(first)
    data = form_data(admin_client.get(url(first)))
    data["dependencies"] = [second.pk]
    response = admin_client.post(url(first), data)
    assert response.status_code == 200 and "cycle" in response.content.decode()
    assert not first.dependencies.exists()
