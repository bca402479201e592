"""The JSON schema of a mission file is generated from its declaration
(`missions.services.files.schema`); the committed copy must be the generated one.

Regenerate it with: python manage.py mission_file_schema > docs/mission-file.schema.json
"""

from __future__ import annotations

import io
import json
import pathlib

import jsonschema
import pytest
import yaml
from django.core.management import call_command

from missions.errors import Invalid
from missions.services.files import mission_file_json_schema, mission_import
from tests.missions.file_helpers import SAMPLE

COMMITTED = pathlib.Path(__file__).resolve().parents[2] / "docs" / "mission-file.schema.json"
REGENERATE = "python manage.py mission_file_schema > docs/mission-file.schema.json"


def test_the_committed_schema_is_the_generated_one():
    out = io.StringIO()
    call_command("mission_file_schema", stdout=out)
    assert json.loads(out.getvalue()) == mission_file_json_schema()
    committed = COMMITTED.read_text(encoding="utf-8") if COMMITTED.exists() else ""
    assert committed == out.getvalue(), f"{COMMITTED.name} is out of date; regenerate it: {REGENERATE}"


def test_the_schema_carries_the_model_limits():
    defs = mission_file_json_schema()["$defs"]
    mission = defs["MissionFileMission"]
    assert mission["additionalProperties"] is False and mission["required"] == ["key", "title"]
    assert mission["properties"]["retry_budget"].items() >= {"minimum": 0, "maximum": 100, "default": 3}.items()
    assert mission["properties"]["status"]["enum"][0] == "planning"
    assert defs["MissionFileFeature"]["properties"]["key"]["maxLength"] == 120
    assert defs["MissionFileAssertion"]["properties"]["scope"]["enum"] == ["feature", "milestone"]


@pytest.mark.django_db
def test_the_schema_and_the_importer_agree_on_a_sample():
    schema = mission_file_json_schema()
    document = yaml.safe_load(SAMPLE)
    jsonschema.validate(document, schema)
    mission_import(document=document)

    document["milestones"][0]["slices"][0]["colour"] = "red"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema)
    with pytest.raises(Invalid) as info:
        mission_import(document=document)
    assert info.value.fields["errors"] == ["milestones[0].slices[0].colour: unknown field"]
