"""What /api/docs/ says of each operation on the plan: one `extend_schema_view` per viewset
of missions/api/views.py (its actions' bodies and answers are declared on the actions).
Written for the API's users: what an operation does and answers, its notable error codes."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema

from missions.api.openapi import NOT_VISIBLE, NOT_VISIBLE_MISSION, VISIBLE_MISSIONS, crud_docs, described, read_docs
from missions.api.task_serializers import TaskSerializer

NOT_VISIBLE_FEATURE = NOT_VISIBLE.format(one="feature")
NOT_VISIBLE_TASK = NOT_VISIBLE.format(one="task")

MISSIONS = crud_docs(
    one="mission",
    many="missions",
    listed="Missions, by id; filter by `status`, `key` or `autopilot`, sort with `ordering`.",
    missing=NOT_VISIBLE_MISSION,
    key_taken="400 `validation_error` on `key` when another mission has the key",
    creating="Creates a mission in `planning`: you are its owner; its `members` (user ids) see and change it too.",
    creating_errors=(
        ", 400 `repository_refused` (a local path or `file://` URL from a user who is not staff, outside"
        " the allowed roots; the reason under `fields`), 400 `credentials_not_allowed`, 400"
        " `unknown_base_revision`, 400 `base_revision_required` (`protected_paths` without `base_revision`),"
        " 403 `staff_only` (`executor_command`, or `credentials_env`, set by a user who is not staff)"
    ),
    changing=(
        "Its `status` and `autopilot` change through the mission's actions (activate, pause, resume,"
        " autopilot), never here."
    ),
    changing_errors=(
        ", the other errors of creating one, 403 `owner_only` (only the owner or staff change `members`,"
        " `validator`, `allowed_validators`, `environment`, the protection fields, and the `repository` of a"
        " mission with a `base_revision`)"
    ),
    deleting="Deletes the mission and everything in it: its plan, tasks, runs, reviews and events.",
    deleting_errors="403 `owner_only`: only its owner or staff may delete it. ",
    activate=described(
        "Activate a mission",
        "Moves a `planning` or `blocked` mission to `active`: its tasks may start and its features are"
        " validated; with the autopilot on, it starts the work. Answers the mission. Errors: 409"
        " `illegal_mission_state` from any other status (`status` is the current one). " + NOT_VISIBLE_MISSION,
    ),
    pause=described(
        "Pause a mission",
        "Moves an `active` or `blocked` mission to `paused`: no task starts and no feature is validated until"
        " it is resumed. Answers the mission. Errors: 409 `illegal_mission_state` from any other status. "
        + NOT_VISIBLE_MISSION,
    ),
    resume=described(
        "Resume a mission",
        "Moves a `paused` or `blocked` mission back to `active`; features an operator stopped go back to"
        " implementing. Answers the mission. Errors: 409 `illegal_mission_state` from any other status, 409"
        " `resume_conflict` when features are blocked for reasons resuming cannot clear (`blockers` lists each:"
        " repair them first). " + NOT_VISIBLE_MISSION,
    ),
    autopilot=described(
        "Turn the autopilot on or off",
        "With `enabled` true, an active mission runs itself: it activates its slices in order, makes their tasks"
        " and takes the next step as verdicts come in; false leaves every next step to you. Answers the mission."
        " Errors: 400 `validation_error` without `enabled`. " + NOT_VISIBLE_MISSION,
    ),
    tree=described(
        "Read a mission's tree",
        "The mission's whole plan in one answer: its milestones in order, each with its assertion keys and the"
        " rollup of their statuses, its slices and their features (loop state, attempts, fix rounds, budget"
        " left, linked assertion keys). " + NOT_VISIBLE_MISSION,
    ),
    export=described(
        "Export a mission file",
        "The mission as a YAML mission file, an attachment named after its key: importing it gives the same"
        " mission. " + NOT_VISIBLE_MISSION,
    ),
    import_=described(
        "Import a mission file",
        "Creates the mission the file's `mission.key` names, or brings the one of yours with that key to what"
        " the file says, in one transaction; the body is the file as YAML (`application/yaml`) or JSON."
        " Answers 201 with the mission when it was created, 200 when it existed, with `changed` (whether"
        " anything changed). A file sent here names its repository by a git URL or an absolute path. Errors:"
        " 400 `invalid_mission_file` (not a valid mission file, or a relative repository path), 400"
        " `repository_refused`, 403 `staff_only` (checks or executor commands from a user who is not staff),"
        " 403 `mission_key_taken` (a mission with this key exists and is not yours).",
    ),
    plan=described(
        "Plan a mission file",
        "The dry run of importing the file (YAML or JSON, as for the import): what it would create, change,"
        " leave unchanged or refuse, each item with its `kind`, `key` and `path` in the file"
        " (`milestones[0].slices[1].features[2]`), the stored objects it leaves alone, and what it would"
        " reopen (`reopened`: a passed feature whose contract changes, a complete slice, milestone or mission)."
        " Nothing is written. Answers `plan_hash` (apply it with `POST /api/missions/apply/?plan_hash=`) and"
        " `state_version`; a file the import would refuse answers `applicable: false` with the `code` the import"
        " answers (400 `invalid_mission_file`, 403 `staff_only`, 400 `repository_refused`, ...) and its `errors`"
        " (`path: message`)."
        " Errors: 404 `not_found` (the file's key is a mission you cannot see).",
    ),
    apply=described(
        "Apply a planned mission file",
        "Imports the file exactly as its plan answered, if `plan_hash` is the hash a plan of this very file"
        " answered against the mission as it is now; answers as the import (201 created, 200 updated, with"
        " `changed`) and `plan`, what was done. Errors: 409 `plan_mismatch` (the hash is not a plan of this"
        " file), 409 `plan_stale` (the mission changed since the plan: plan again), 400 `validation_error`"
        " (no `plan_hash`), 404 `not_found`, and the import's errors.",
    ),
    events=described(
        "List a mission's events",
        "The mission's audit log, newest first, 50 per page (`page`): every change with its type, payload and"
        " the user who made it. " + NOT_VISIBLE_MISSION,
    ),
)

MILESTONES = crud_docs(
    one="milestone",
    many="milestones",
    listed="Milestones, by mission and order; filter by `mission`, `status`, `validation_state` or `key`.",
    creating=(
        "Adds a milestone to a mission; `order` places it, `dependencies` are milestones of the same mission"
        " it waits for, `environment` (null: the mission's) is where its checks run."
    ),
    creating_errors=(
        ", 400 `invalid` (a dependency in another mission), 403 `owner_only` (an `environment` set by someone"
        " other than the mission's owner or staff)"
    ),
    changing_errors=", 400 `dependency_cycle`, the other errors of creating one",
    deleting="Deletes the milestone with its slices, features, assertions and runs.",
    validation=described(
        "Read a milestone's rollup",
        "How the milestone's assertions stand, counted now: `total`, `passed`, `failed`, `blocked`, `pending`,"
        " the feature-scoped ones no feature covers (`unlinked`), and the `state` they add up to (the"
        " milestone's `validation_state`). " + NOT_VISIBLE.format(one="milestone"),
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="The rollup's counts and state.")},
    ),
)

SLICES = crud_docs(
    one="slice",
    many="slices",
    listed="Slices, by milestone and order; filter by `mission`, `milestone`, `status` or `key`.",
    creating="Adds a slice of work to a milestone; its mission is the milestone's.",
    changing="It may move to another milestone of the same mission.",
    changing_errors=", 400 `invalid` (a milestone of another mission)",
    deleting="Deletes the slice with its features and their tasks and runs.",
)

FEATURES = crud_docs(
    one="feature",
    many="features",
    listed=(
        "Features, by slice and order; filter by `mission`, `slice`, `slice__milestone`, `status`,"
        " `loop_state`, `key` or `generated_from` (the feature a fix was made for)."
    ),
    creating=(
        "Adds a feature to a slice. It starts `idle`; a task for it starts its loop, and the assertions"
        " linked to it (link) are what it is judged by."
    ),
    changing="It may move to another slice of the same mission.",
    changing_errors=", 400 `invalid` (a slice of another mission)",
    deleting="Deletes the feature with its tasks, runs and links.",
    deleting_errors="409 `task_running`: its task is in progress (stop it first, or send `force`). ",
    destroy=extend_schema(
        parameters=[OpenApiParameter("force", OpenApiTypes.BOOL, description="Delete it even while its task runs.")]
    ),
    link=described(
        "Link an assertion to a feature",
        "The feature is judged by the feature-scoped assertions linked to it; `assertion` is the id or key of"
        " one in the feature's mission. Answers 201 with the feature. Errors: 400 `validation_error` without"
        " `assertion`, 400 `unknown_assertion` (none in this mission), 400 `milestone_scoped` (an assertion"
        " judged on its milestone is never linked), 409 `already_linked`. " + NOT_VISIBLE_FEATURE,
    ),
    unlink=described(
        "Unlink an assertion from a feature",
        "The feature is no longer judged by that assertion (`assertion`: its id or key). Answers the feature."
        " Errors: 400 `validation_error` without `assertion`, 400 `unknown_assertion`, 400 `not_linked`. "
        + NOT_VISIBLE_FEATURE,
    ),
)

ASSERTIONS = crud_docs(
    one="assertion",
    many="assertions",
    listed="Contract assertions, by milestone and order; filter by `mission`, `milestone`, `status`, `scope` or `key`.",
    creating=(
        "Adds a contract assertion to a milestone: `statement` says what must hold; `scope` `feature` judges"
        " the features linked to it, `milestone` the milestone as a whole; `check` is an optional"
        " deterministic check (staff only: it runs commands). Its `status` is set by verdicts only."
    ),
    creating_errors=(
        ", 400 `invalid_check` (the check is not valid; the problems under `fields`), 403 `staff_only` (a"
        " `check` from a user who is not staff)"
    ),
    changing="Passed features judged by it are judged again when what it says changes.",
    changing_errors=(
        ", the other errors of creating one, 400 `linked_assertion` (made milestone-scoped while linked to features)"
    ),
    deleting="Deletes the assertion; the features it judged are judged again without it.",
)

TASKS = crud_docs(
    one="task",
    many="tasks",
    listed="Tasks, by id; filter by `mission`, `feature` or `status`.",
    key_taken="",
    creating=(
        "Creates a task for a feature (its mission is the feature's) or for a mission alone: `feature` or"
        " `mission` is required. Without `title` or `prompt` they are made from the feature. A task for a"
        " feature moves it to implementing; under the `command` executor, in an active mission, it starts at once."
    ),
    creating_errors=(
        ", 400 `validation_error` too without `feature` and `mission` or with a feature of another mission,"
        " 409 `task_open` (the feature has a task that is `todo` or `in_progress`)"
    ),
    changing="Changes its `title` or `prompt`; its state changes through start, complete and fail.",
    changing_errors=", 400 `invalid` (another `feature`)",
    deleting="Deletes the task.",
    create=extend_schema(responses={201: TaskSerializer}),
    start=described(
        "Start a task",
        "Moves a `todo` task to `in_progress`. Answers the task. Errors: 409 `illegal_task_state` from any"
        " other state, 409 `mission_not_active`. " + NOT_VISIBLE_TASK,
    ),
    complete=described(
        "Complete a task",
        "Records the `revision` the task's work landed at (a commit, branch or tag of the mission's"
        " repository, pinned to its commit id) with an optional `summary`, and moves the task to `done`; its"
        " feature is then validated. The same completion sent again answers the task unchanged. Errors: 400"
        " `validation_error` without `revision`, 400 `unknown_revision` (not in the repository), 409"
        " `illegal_task_state` (the task failed or was cancelled), 409 `task_already_done` (done at another"
        " revision, given as `revision`). " + NOT_VISIBLE_TASK,
    ),
    fail=described(
        "Fail a task",
        "Moves a `todo` or `in_progress` task to `failed`, with an optional `reason`. Answers the task."
        " Errors: 409 `illegal_task_state` from any other state. " + NOT_VISIBLE_TASK,
    ),
)

EVENTS = read_docs(
    one="event",
    many="events",
    listed=(
        "The audit log of the missions you can see, by mission and sequence number: every change with its"
        " type, payload and the user who made it; filter by `mission` or `type`."
    ),
    read=VISIBLE_MISSIONS,
)
