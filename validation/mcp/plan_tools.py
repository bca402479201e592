"""The tools that write a mission's contract: plan and apply a mission file, add one
assertion or one feature (docs/MCP.md, "Writing the contract").

`mission_plan` and `mission_apply` are `POST /api/missions/plan/` and
`POST /api/missions/apply/` (`missions/services/files/planning.py`: the import's own code
path, its dry run and its apply by the plan's hash); `assertion_add` and `feature_add` are
`POST /api/assertions/` and `POST /api/features/`: the API's serializers in front of the
same services (`missions/services/hierarchy.py`), so a changed contract reopens what it
touches (docs/TRUTH.md) and a refusal carries the API's code. Every call is the user's own.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from missions.api.serializers import AssertionSerializer, FeatureSerializer, MissionSerializer
from missions.errors import Invalid
from missions.models import ContractAssertion, Mission, MissionFeature
from missions.services import hierarchy
from missions.services.files import yaml_io
from missions.services.files.planning import mission_apply as apply_file
from missions.services.files.planning import mission_plan as plan_file
from validation.mcp import schemas
from validation.mcp.context import Principal, db, load_user
from validation.mcp.loop_tools import api_context, milestone_for, slice_for
from validation.mcp.tooling import Call, Tool

# ---------------------------------------------------------------- plan and apply


def _same_mission(principal: Principal, document: Any) -> None:
    """On a mission endpoint, the file must be of the connection's mission."""
    if principal.mission_id is None:
        return
    raw = yaml_io.load(document, [])
    key = raw.get("mission", {}).get("key") if isinstance(raw, dict) and isinstance(raw.get("mission"), dict) else None
    own = Mission.objects.filter(pk=principal.mission_id).values_list("key", flat=True).first()
    if key is not None and key != own:
        raise Invalid(
            "this connection is scoped to another mission",
            code="mission_mismatch",
            fields={"document": ["mission.key is not the connection's mission"]},
        )


def _plan(principal: Principal, arguments: dict[str, Any]) -> dict[str, Any]:
    user = load_user(principal)
    _same_mission(principal, arguments["document"])
    return plan_file(document=arguments["document"], user=user, from_api=True).as_dict()


def _apply(principal: Principal, arguments: dict[str, Any]) -> dict[str, Any]:
    user = load_user(principal)
    _same_mission(principal, arguments["document"])
    applied = apply_file(document=arguments["document"], plan_hash=arguments["plan_hash"], user=user, from_api=True)
    result = applied.result
    return {
        "mission": dict(MissionSerializer(result.mission, context=api_context(user)).data),
        "created": result.created,
        "changed": result.changed,
        "plan": applied.plan.as_dict(),
    }


async def mission_plan(call: Call) -> dict[str, Any]:
    return await db(_plan)(call.principal, call.arguments)


async def mission_apply(call: Call) -> dict[str, Any]:
    return await db(_apply)(call.principal, call.arguments)


# ---------------------------------------------------------------- one assertion, one feature


def _by_keys(model: type[Any], noun: str, field: str, mission_id: int, keys: list[str]) -> list[Any]:
    """The mission's objects of these keys, in their order; an unknown key is the API's
    `unknown_<noun>`, each under the argument that named it."""
    found = {o.key: o for o in model.objects.filter(mission_id=mission_id, key__in=keys)}
    if missing := [k for k in keys if k not in found]:
        raise Invalid(
            f"no {noun} {', '.join(map(repr, missing))} in this mission",
            code=f"unknown_{noun}",
            fields={field: [f"unknown in this mission: {k}" for k in missing]},
        )
    return [found[k] for k in keys]


_ASSERTION_FIELDS = ("key", "title", "statement", "scope", "check", "order")
_FEATURE_FIELDS = ("key", "title", "description", "acceptance_criteria", "order")


def _add_assertion(principal: Principal, arguments: dict[str, Any]) -> dict[str, Any]:
    user = load_user(principal)
    context = api_context(user)
    milestone = milestone_for(
        user=user, principal=principal, ref=arguments["milestone"], mission_ref=arguments.get("mission")
    )
    data = {"milestone": milestone.pk, **{k: arguments[k] for k in _ASSERTION_FIELDS if k in arguments}}
    body = AssertionSerializer(data=data, context=context)
    body.is_valid(raise_exception=True)
    with transaction.atomic():
        assertion = hierarchy.assertion_create(user=user, **body.validated_data)
        for feature in _by_keys(
            MissionFeature, "feature", "features", milestone.mission_id, arguments.get("features", [])
        ):
            hierarchy.assertion_link(user=user, feature=feature, assertion=assertion)
    return dict(AssertionSerializer(ContractAssertion.objects.get(pk=assertion.pk), context=context).data)


def _add_feature(principal: Principal, arguments: dict[str, Any]) -> dict[str, Any]:
    user = load_user(principal)
    context = api_context(user)
    slice_ = slice_for(user=user, principal=principal, ref=arguments["slice"], mission_ref=arguments.get("mission"))
    data = {"slice": slice_.pk, **{k: arguments[k] for k in _FEATURE_FIELDS if k in arguments}}
    body = FeatureSerializer(data=data, context=context)
    body.is_valid(raise_exception=True)
    fields = dict(body.validated_data)
    with transaction.atomic():
        assertions = _by_keys(
            ContractAssertion, "assertion", "assertions", slice_.mission_id, arguments.get("assertions", [])
        )
        feature = hierarchy.feature_create(user=user, slice_=fields.pop("slice"), assertions=assertions, **fields)
    return dict(FeatureSerializer(MissionFeature.objects.get(pk=feature.pk), context=context).data)


async def assertion_add(call: Call) -> dict[str, Any]:
    return await db(_add_assertion)(call.principal, call.arguments)


async def feature_add(call: Call) -> dict[str, Any]:
    return await db(_add_feature)(call.principal, call.arguments)


TOOLS = [
    Tool(
        name="mission_plan",
        title="Plan a mission file",
        description="The dry run of importing a mission file (YAML or JSON text, or the object; the schema of "
        "docs/mission-file.schema.json): what it would create, change, leave unchanged or refuse, each item with "
        "its kind, key and path in the file (milestones[0].slices[1].features[2]), the stored objects it leaves "
        "alone, and what it would reopen (a passed feature whose contract changes). Nothing is written. Answers "
        "plan_hash, to pass to mission_apply with the same file; a file the import would refuse answers "
        "applicable false with the import's code and its 'path: message' errors.",
        input_schema=schemas.closed({"document": schemas.MISSION_DOCUMENT}, ("document",)),
        output_schema=schemas.PLAN,
        handler=mission_plan,
    ),
    Tool(
        name="mission_apply",
        title="Apply a planned mission file",
        description="Import the mission file exactly as mission_plan answered it: plan_hash must be the hash a "
        "plan of this very file answered against the mission as it is now (else plan_mismatch, or plan_stale "
        "when the mission changed since: plan again). Answers the mission, whether it was created or changed, "
        "and the plan of what was done.",
        input_schema=schemas.closed(
            {"document": schemas.MISSION_DOCUMENT, "plan_hash": {"type": "string", "minLength": 1, "maxLength": 200}},
            ("document", "plan_hash"),
        ),
        output_schema=schemas.APPLIED,
        handler=mission_apply,
        read_only=False,
    ),
    Tool(
        name="assertion_add",
        title="Add a contract assertion",
        description="Add an assertion to a milestone (as POST /api/assertions/): key, title, statement, scope "
        "(feature or milestone), an optional check (staff only), and the keys of features it is to judge. A "
        "changed contract reopens the milestone and judges again the passed features it touches.",
        input_schema=schemas.closed(
            {
                "mission": schemas.MISSION_ARG,
                "milestone": schemas.MILESTONE_ARG,
                "key": {"type": "string", "minLength": 1},
                "title": {"type": "string", "minLength": 1},
                "statement": {"type": "string"},
                "scope": {"enum": ["feature", "milestone"]},
                "check": {"type": ["object", "null"]},
                "order": {"type": "integer", "minimum": 0},
                "features": {"type": "array", "items": {"type": "string", "minLength": 1}},
            },
            ("milestone", "key", "title", "statement"),
        ),
        output_schema=schemas.ROW,
        handler=assertion_add,
        read_only=False,
    ),
    Tool(
        name="feature_add",
        title="Add a feature",
        description="Add a feature to a slice (as POST /api/features/): key, title, description, acceptance "
        "criteria, and the keys of the assertions it fulfils (feature-scoped assertions of the mission). New work "
        "reopens the complete slice, milestone and mission above it.",
        input_schema=schemas.closed(
            {
                "mission": schemas.MISSION_ARG,
                "slice": {**schemas.REF, "description": "Slice id, or its key within the mission."},
                "key": {"type": "string", "minLength": 1},
                "title": {"type": "string", "minLength": 1},
                "description": {"type": "string"},
                "acceptance_criteria": {"type": "string"},
                "order": {"type": "integer", "minimum": 0},
                "assertions": {"type": "array", "items": {"type": "string", "minLength": 1}},
            },
            ("slice", "key", "title"),
        ),
        output_schema=schemas.ROW,
        handler=feature_add,
        read_only=False,
    ),
]
