"""`manage.py plan SPEC.md`: the configured model drafts a mission file in the file's own
schema; a draft with mistakes goes back to the model with the import's lines; the command
prints YAML a person can plan, and never writes anything."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from django.core.management import CommandError, call_command
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from missions.models import Mission, MissionEvent
from missions.services.files.planning import mission_plan
from validation.validators.agent_models import register_model

pytestmark = pytest.mark.django_db

DRAFT = {
    "mission": {"key": "todo", "title": "A todo list"},
    "milestones": [
        {
            "key": "m1",
            "title": "Items",
            "assertions": [
                {"key": "VAL-ITEM-001", "title": "An item is added", "statement": "add('x') lists x"},
                {"key": "VAL-ITEM-002", "title": "An item is removed", "statement": "remove('x') drops x"},
            ],
            "slices": [
                {
                    "key": "s1",
                    "title": "Editing",
                    "features": [
                        {"key": "add-item", "title": "Add an item", "assertions": ["VAL-ITEM-001"]},
                        {"key": "add-item", "title": "Remove an item", "assertions": ["VAL-ITEM-002"]},
                    ],
                }
            ],
        }
    ],
}


@pytest.fixture
def drafter(settings):
    """A scripted model behind an agent profile: a first draft with a duplicate key, then the fix."""
    calls: list[list] = []

    def model_fn(messages, info: AgentInfo) -> ModelResponse:
        calls.append(messages)
        draft = json.loads(json.dumps(DRAFT))
        if len(calls) > 1:
            draft["milestones"][0]["slices"][0]["features"][1]["key"] = "remove-item"
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, json.dumps(draft))])

    register_model("draft-model", FunctionModel(model_fn))
    settings.FUSION_VALIDATORS = {"drafter": {"kind": "agent", "model": "draft-model"}}
    yield calls
    register_model("draft-model", None)


def test_the_model_drafts_a_file_that_plans_cleanly_and_nothing_is_written(drafter, tmp_path, alice):
    spec = tmp_path / "SPEC.md"
    spec.write_text("# Todo\nA list of items: add and remove them.\n")
    out = io.StringIO()
    call_command("plan", str(spec), "--profile", "drafter", stdout=out)
    text = out.getvalue()
    data = yaml.safe_load(text)
    assert data["mission"] == {"key": "todo", "title": "A todo list"}
    assert [f["key"] for f in data["milestones"][0]["slices"][0]["features"]] == ["add-item", "remove-item"]
    # The first draft went back with the import's own line for its mistake.
    assert len(drafter) == 2, drafter
    told = str(drafter[1][-1].parts[0].content)
    assert "milestones[0].slices[0].features[1].key: duplicate key add-item" in told, told
    assert Mission.objects.count() == 0 and MissionEvent.objects.count() == 0
    plan = mission_plan(document=text, user=alice)
    assert plan.applicable and len(plan.created) == 7 and Mission.objects.count() == 0


def test_a_profile_without_a_model_is_refused(settings, tmp_path):
    spec = tmp_path / "SPEC.md"
    spec.write_text("anything")
    settings.FUSION_VALIDATORS = {}
    with pytest.raises(CommandError, match="has no model"):
        call_command("plan", str(spec), stdout=io.StringIO())
    with pytest.raises(CommandError, match="cannot read"):
        call_command("plan", str(tmp_path / "missing.md"), stdout=io.StringIO())
