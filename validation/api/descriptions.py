"""What /api/docs/ says of each operation on validation runs, fix lineage, reviews and the
loop's actions on a feature: one `extend_schema_view` per viewset of validation/api/
(bodies and answers are declared on the actions). Written for the API's users."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_view

from missions.api.openapi import NOT_VISIBLE, VISIBLE_MISSIONS, described, read_docs

NOT_VISIBLE_FEATURE = NOT_VISIBLE.format(one="feature")
NOT_VISIBLE_RUN = NOT_VISIBLE.format(one="run")
NOT_VISIBLE_REVIEW = "404 `not_found`: no such review, or one you cannot see."
# The answer of validate, and of repair's re_run.
ADMISSION = (
    "Answers 202 when a run started (`outcome` `started`, the run under `run`), 200 when a passing run of"
    " the same input was reused (`reused`) or the same input failed too often and the feature is now"
    " blocked (`blocked`, why under `detail`)."
)
ADMISSION_ERRORS = (
    "400 `validator_not_allowed` (a profile the mission does not allow; `allowed` lists its profiles), 400"
    " `unknown_validator`, 400 `no_revision` (no landed task and no repository), 400 `unknown_revision` (no task"
    " landed a revision and the mission's branch does not exist), 400 `no_assertions`, 400"
    " `workspace_unavailable` (the repository could not be read), 409 `mission_not_active`, 409"
    " `validation_already_running` (`run` is the running one), 409 `feature_blocked` (repair it), 409"
    " `feature_superseded` (a fix whose root passed)"
)
# The answer of a milestone's validate.
MILESTONE_VALIDATE = """Validate the milestone as a whole, once every feature under it is done (passed, or a fix
closed because its feature passed). Use it when the mission's autopilot is off; with the
autopilot on, milestones are validated for you.

Its slices are marked complete, and the milestone's assertions are judged by a new
validation run at the newest passed revision of its features. When that run passes, the
milestone is complete, and so is the mission when this was its last incomplete milestone;
when it fails, each failure goes back to the feature that answers for it (and a fix
feature is made when the mission has `auto_fix`).

Answers 202 with the run when one starts (also after a failed run over the same input:
asking again judges it again). Answers 200 when the milestone is complete without a new
run (it has no assertions, or a run over exactly the same input passed), or when a run is
already judging it (`outcome: already_running`).

Errors, each changing nothing: 409 `mission_not_active`; 409 `dependencies_open` (a milestone
it depends on is not complete); 409 `features_open` (a feature under it is not done; each
feature and its state under `features`); 409 `no_milestone_revision` (its features'
revisions are not on one line of history: merge them and complete a task at the merged
revision); 400 `unknown_validator`; 400 `workspace_unavailable` (the repository could not be
read); 400 `unknown_revision` (no feature passed at a revision and the mission's branch does
not exist)."""
REVIEW_RECEIPT = (
    "Answers 202 with a receipt (`id`, `state`, `result_url`, `events_url`; the review's address is also the"
    " Location header); the review runs in the background. The same `Idempotency-Key` with the same request"
    " answers the same review (`replayed` true, header `Idempotent-Replayed`)."
)
REVIEW_ERRORS = (
    "409 `idempotency_key_reused` (the key was used for another request), 400 `invalid_idempotency_key`, 400"
    " `unknown_review_profile`, 503 `review_profile_unavailable` (no review profile is configured)"
)

RUNS = read_docs(
    one="validation run",
    many="validation runs",
    listed=(
        "Validator runs, newest first: what each judged (revision, validator, frozen input) and its verdict"
        " and failures; filter by `mission`, `feature`, `milestone`, `status`, `scope` or `trigger`, sort with"
        f" `ordering`. {VISIBLE_MISSIONS}"
    ),
    read="Its verdict, failures and the tokens it used.",
    journal=described(
        "Read a run's journal",
        "Every exchange of the run, in order, 50 per page (`page`): model and tool calls, check results and the"
        " decision, each chained to the one before by its hash. " + NOT_VISIBLE_RUN,
    ),
    replay=described(
        "Replay a run",
        "Runs the validator again from the run's journal alone (no live model, tool or check call) and compares"
        " the verdict's hash with the recorded one; the answer is the report the replay_run command prints with"
        " --json. A journal that fails its hash chain is a result (`ok` false, with the integrity error and the"
        " first bad sequence number), not a request error. Errors: 409 `run_running` while the run runs. "
        + NOT_VISIBLE_RUN,
    ),
)

LINEAGE = read_docs(
    one="lineage row",
    many="fix lineage",
    listed=(
        "How fixes descend from failures: each row links the original feature (`root`), the feature whose"
        " failed run (`run`) called for the fix (`source`), the fix, and the assertions that failed; filter by"
        f" `root`, `source`, `fix` or `run`. {VISIBLE_MISSIONS}"
    ),
)

REVIEWS = read_docs(
    one="review",
    many="reviews",
    listed=(
        "Advisory reviews, newest first: those of the missions you can see and those you asked for without a"
        " mission (staff: all); filter by `mission`, `feature`, `state` or `profile`, sort with `ordering`."
    ),
    read="Its state, request, accounting and artifacts (names and hashes; artifact gives the content).",
    missing=NOT_VISIBLE_REVIEW,
    create=described(
        "Request a review",
        "An advisory review of a change: the body says what it is meant to do, what changed and how it was"
        " verified; `mission`, `feature` and `revision` tie it to the plan. Advisory: it never changes a"
        f" verdict. {REVIEW_RECEIPT} Errors: 400 `invalid_review_request` (the problems under `fields`), 400"
        " `review_request_too_large`, 400 `unknown_reference` (no such mission or feature), 400"
        f" `revision_unavailable`, {REVIEW_ERRORS}.",
    ),
    result=described(
        "Read a review's result",
        "Never waits: while the review runs, its state; once it completed, the verified report with its"
        " accounting. Errors: 409 `review_integrity_error` when a stored artifact does not verify. "
        + NOT_VISIBLE_REVIEW,
    ),
    artifact=described(
        "Read a review's artifact",
        "One artifact of the review, whole, by `name`, checked against its hash (header `X-Content-SHA256`)."
        " Errors: 404 `not_found` for a name the review does not have, 409 `review_integrity_error`. "
        + NOT_VISIBLE_REVIEW,
    ),
    cancel=described(
        "Cancel a review",
        "Stops the review between stages and in flight. Answers the review, `cancelled`. Errors: 409"
        " `review_finished` when it has ended already. " + NOT_VISIBLE_REVIEW,
    ),
)

FEATURE_LOOP = extend_schema_view(
    validate=described(
        "Validate a feature",
        "Judges the feature's landed revision by its linked assertions, with the mission's validator or the"
        f" profile `validator` names. {ADMISSION} Errors: {ADMISSION_ERRORS}. {NOT_VISIBLE_FEATURE}",
    ),
    repair=described(
        "Repair a stopped feature",
        "For a `blocked`, `needs_fix` or `passed` feature. `mode` `clear`: back to implementing with its"
        " attempts and fix rounds reset, answers 200 with the feature; `re_run`: validates it again even when"
        f" blocked, and answers as validate. `reason` goes to the audit log. {ADMISSION} Errors: 409"
        " `not_repairable` (any other loop state; `loop_state` is the current one), 409"
        f" `validation_already_running`, and for `re_run` those of validate. {NOT_VISIBLE_FEATURE}",
    ),
    create_fix=described(
        "Create a fix for a feature",
        "For a feature whose last validation failed (`needs_fix`): creates the fix feature that answers the"
        " failures, in the same slice, and answers it (201); a fix round of the retry budget is used. Errors:"
        " 409 `no_failure`, 409 `fix_exists` (this failure has its fix), 409 `budget_exhausted` (the budget is"
        f" used up: the feature is blocked). {NOT_VISIBLE_FEATURE}",
    ),
    loop=described(
        "Read a feature's loop",
        "Where the feature is in implement -> validate -> fix: its loop state, attempts, fix rounds and budget"
        " left, why it stopped, its validation runs (newest first) and its fix lineage. " + NOT_VISIBLE_FEATURE,
    ),
    review=described(
        "Review a feature's change",
        "An advisory review of the feature's change, its request filled from the feature: its title and"
        f" description, linked assertions, latest task and latest validation. {REVIEW_RECEIPT} Errors: 409"
        f" `nothing_to_review` (nothing landed to review yet), {REVIEW_ERRORS}. {NOT_VISIBLE_FEATURE}",
    ),
)
