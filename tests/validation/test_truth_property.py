"""The truth property, stateful: whatever order the messages arrive in, however often, and
whatever operators, workers and edits do meanwhile, a feature is `passed` only at a
revision where its implementation truly satisfies what it was judged by.

Real services, a real database, a real git repository per example, real checks in real
snapshots. No worker runs: every Dramatiq message the services send is captured
(`Actor.send_with_options` is replaced by a recorder) and the machine delivers them
itself, in any order, twice, late, or never (a worker that dies holding a run).

The model (`truth_model.py`) knows the files of every commit the test makes, so it knows
whether each check truly holds there without asking the code under test.

The implementation is an adversary: besides right and wrong ones, a commit may rewrite a
protected test, subvert the test process from inside (a module the protected pytest test
imports ends the process or rewrites the reports), add or edit the test runner's
configuration, or be right and add its own tests under the protected folder (which must
never fail it: invariant `false_protected_fail`). The base may be named by the branch the
implementations commit onto (`main`); work may be added or moved under complete slices,
milestones and the mission; the mission's credentials variable may change between runs
(a mirror per credential identity), and a variable the deployment does not allow is
refused.

The `test_found_*` tests at the end drive the same machine by hand through sequences this
property found (each was a real defect): fast, deterministic guards of them.

Knobs: FUSION_TRUTH_EXAMPLES (default 300 embedded, 320 with DATABASE_URL),
FUSION_TRUTH_STEPS (default 20), FUSION_TRUTH_SHRINK=0 (report the failing example as found,
without minutes of shrinking), FUSION_TRUTH_SKIP (comma-separated invariant names to
leave out while hunting for the next defect, e.g. `stale_completion`).
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import dramatiq
import pytest
from django.conf import settings as django_settings
from django.utils import timezone
from hypothesis import HealthCheck, Phase, settings
from hypothesis import note as _note
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import validation.actors  # noqa: E402,F401 — declares the actors whose messages the machine delivers
from missions import delivery
from missions.errors import DomainError, IllegalTransition
from missions.models import (
    AssertionScope,
    ContractAssertion,
    FeatureAssertion,
    LoopState,
    Milestone,
    MilestoneStatus,
    Mission,
    MissionEvent,
    MissionFeature,
    MissionStatus,
    Slice,
    SliceStatus,
    Task,
    TaskStatus,
)
from missions.services import hierarchy, lifecycle
from missions.services.rollup import milestone_rollup_refresh
from missions.services.tasks import task_complete, task_create
from tests.validation import truth_model as model
from validation import protect
from validation.models import FixLineage, RunScope, RunStatus, ValidatorRun
from validation.selectors import feature_revision
from validation.services import operator, runner
from validation.services.autopilot import autopilot_advance
from validation.services.recovery import reap_runs, recover

pytestmark = pytest.mark.django_db(transaction=True)

ON_POSTGRES = bool(os.environ.get("DATABASE_URL"))
EXAMPLES = int(os.environ.get("FUSION_TRUTH_EXAMPLES", 320 if ON_POSTGRES else 300))
STEPS = int(os.environ.get("FUSION_TRUTH_STEPS", 20))
SHRINK = os.environ.get("FUSION_TRUTH_SHRINK", "1") != "0"
SKIP = {s.strip() for s in os.environ.get("FUSION_TRUTH_SKIP", "").split(",") if s.strip()}
DONE = (LoopState.PASSED, LoopState.SUPERSEDED)
TOKEN_ENV = "FUSION_TRUTH_TOKEN"  # the credential variable `credentials` toggles (a local source ignores it)
CREDENTIALS = (TOKEN_ENV, TOKEN_ENV, "SECRET_KEY")  # the last one the deployment does not allow
OPEN_TASK = (TaskStatus.TODO, TaskStatus.IN_PROGRESS)


# ---------------------------------------------------------------- the message recorder


@dataclass
class Message:
    actor: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    attempt: int = 0

    def __repr__(self) -> str:
        return f"{self.actor}{self.args}"


class _Sink:
    machine: TruthMachine | None = None


STATS: Counter = Counter()  # what the examples reached, printed at the end
TIMES: Counter = Counter()  # seconds spent per rule and in the invariants


def note(text: str) -> None:
    """hypothesis.note inside an example; print when the machine is driven by hand."""
    try:
        _note(text)
    except Exception:  # noqa: BLE001 — outside a hypothesis test (a reproduction script)
        print(text)


def _counted(fn):
    @functools.wraps(fn)
    def step(self, *args, **kwargs):
        STATS[f"rule {fn.__name__}"] += 1
        started = time.monotonic()
        try:
            return fn(self, *args, **kwargs)
        finally:
            TIMES[fn.__name__] += time.monotonic() - started

    return step


def _record(self, *, args=(), kwargs=None, **_options):
    machine = _Sink.machine
    if machine is None:
        raise AssertionError(f"{self.actor_name}{tuple(args)} sent outside an example")
    machine.pending.append(Message(self.actor_name, tuple(args), dict(kwargs or {})))


def _record_send(self, *args, **kwargs):
    return _record(self, args=args, kwargs=kwargs)


# ---------------------------------------------------------------- the machine


class TruthMachine(RuleBasedStateMachine):
    template: model.Template  # set by the test function

    def __init__(self):
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="truth-"))
        self.pending: list[Message] = []
        self.delivered: list[Message] = []  # for redeliveries
        self.dead: list[int] = []  # runs claimed by a worker that then died
        self.mission: Mission | None = None
        self.history: model.History | None = None
        self.kinds: dict[str, str] = {}  # commit -> "correct f1" / "wrong f2 {a3}" / "rewrite f1"
        self.refused: list[str] = []
        self.illegal: list[str] = []
        self.steps = 0
        self.finished = True  # until the set-up says otherwise
        self.seen_seq = 0  # the audit log read so far (fix rounds per root)
        self.rounds: dict[int, int] = {}
        self.grown = 0  # features `grow` made
        self.judged: set[int] = set()  # finished runs whose verdicts were read
        self.base_named = "sha"
        _Sink.machine = self

    # ------------------------------------------------------------ set-up and teardown

    @initialize(
        autopilot=st.sampled_from((True, True, False)),
        auto_fix=st.booleans(),
        budget=st.integers(1, 3),
        active=st.sampled_from((True, True, False)),
        per_slice=st.sampled_from(((1, 1), (1, 1), (1, 2), (2, 1), (2, 2))),
        per_feature=st.lists(st.integers(1, 2), min_size=4, max_size=4),
        variants=st.lists(st.sampled_from(("file", "run", "protected")), min_size=9, max_size=9),
        milestone_check=st.sampled_from((None, None, "file", "run", "protected")),
        spare=st.sampled_from((False, False, True)),  # an unlinked assertion: the milestone never passes
        may_finish=st.booleans(),
        # One assertion (a1 or a2) checked by a protected pytest test, in a quarter of the
        # examples: what an implementation can subvert from inside the test process (a
        # pytest run costs ten times a script's: never more than one such assertion).
        pytest_at=st.sampled_from((None, None, None, None, None, None, 0, 1)),
        # The base named by a branch the implementations commit onto (README's own shape).
        base_named=st.sampled_from(("sha", "sha", "sha", "main")),
    )
    @_counted
    def setup(
        self,
        autopilot,
        auto_fix,
        budget,
        active,
        per_slice,
        per_feature,
        variants,
        milestone_check,
        spare,
        may_finish=True,
        pytest_at=None,
        base_named="sha",
    ):
        self.finished = not may_finish  # `finish` in half of the examples (it costs a dozen runs)
        self.history = self.template.clone(self.tmp / "repo")
        if pytest_at is not None:
            variants = [*variants[:pytest_at], "pytest", *variants[pytest_at + 1 :]]
        self.base_named = base_named
        # Through the service the API and mission files use: the base is pinned to the
        # commit its name resolves to now, whatever the branch does later.
        self.mission = hierarchy.mission_create(
            user=None,
            key=f"truth-{uuid.uuid4().hex[:12]}",
            title="Truth",
            status=MissionStatus.ACTIVE if active else MissionStatus.PLANNING,
            autopilot=autopilot,
            auto_fix=auto_fix,
            retry_budget=budget,
            repository=str(self.history.repo.path),
            base_revision=self.template.base if base_named == "sha" else "main",
            protected_paths=["tests/**"],
        )
        milestone = Milestone.objects.create(mission=self.mission, key="m1", title="Milestone 1")
        keys = iter(model.ASSERTION_KEYS[:8])
        n = 0
        for s, count in enumerate(per_slice):
            slice_ = Slice(milestone=milestone, key=f"s{s + 1}", title=f"Slice {s + 1}", order=s)
            slice_.save()
            for i in range(count):
                n += 1
                feature = MissionFeature(
                    slice=slice_, key=f"f{n}", title=f"Feature f{n}", description=f"Build f{n}.", order=i
                )
                feature.save()
                for _ in range(per_feature[n - 1]):
                    key = next(keys)
                    assertion = self._assertion(milestone, key, variants[int(key[1:]) - 1])
                    FeatureAssertion.objects.create(feature=feature, assertion=assertion)
        if spare:
            self._assertion(milestone, "a9", variants[8])
        if milestone_check:
            self._assertion(milestone, model.MILESTONE_KEY, milestone_check, scope=AssertionScope.MILESTONE)
        milestone_rollup_refresh(milestone_ids=[milestone.pk])
        if autopilot and active:  # as the activation of a mission that runs itself would have sent
            self.pending.append(Message("autopilot_advance", (self.mission.pk,)))

    def _assertion(self, milestone, key, variant, scope=AssertionScope.FEATURE) -> ContractAssertion:
        assertion = ContractAssertion(
            milestone=milestone,
            key=key,
            title=f"{key} holds",
            statement=f"{key}.txt says done {key}",
            scope=scope,
            check_spec=model.check_spec(key, variant),
        )
        assertion.save()
        return assertion

    def teardown(self):
        _Sink.machine = None
        started = time.monotonic()
        try:
            if self.mission is not None:
                self._tally()
                Mission.objects.filter(pk=self.mission.pk).delete()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
            TIMES["teardown"] += time.monotonic() - started

    def _tally(self) -> None:
        STATS["examples"] += 1
        STATS[f"steps of an example ~{self.steps // 5 * 5}"] += 1
        runs = ValidatorRun.objects.filter(mission=self.mission)
        STATS["runs"] += runs.count()
        for status, revision, assertions in runs.values_list("status", "revision", "assertions"):
            STATS[f"run {status}"] += 1
            kind = self.kinds.get(revision, "base").split()[0]
            if kind not in ("base", "correct", "wrong"):
                STATS[f"run at a {kind} commit {status}"] += 1
            if any(model.variant_of(a["check"]) == "pytest" for a in assertions):
                STATS[f"run with a pytest check {status}"] += 1
        if self.base_named != "sha":
            STATS[f"examples with the base named {self.base_named}"] += 1
        STATS["features grown"] += self.grown
        STATS["milestone runs"] += runs.filter(scope=RunScope.MILESTONE).count()
        for run in runs.filter(scope=RunScope.MILESTONE, status=RunStatus.FAILED):
            for key in run.failures.values_list("assertion_key", flat=True):
                STATS[f"milestone run failed on {key}"] += 1
        if Mission.objects.filter(pk=self.mission.pk).exclude(status_reason="").exists():
            reason = Mission.objects.get(pk=self.mission.pk).status_reason
            STATS[f"autopilot stopped: {reason.split(':')[0][:60]}"] += 1
        for state in MissionFeature.objects.filter(mission=self.mission).values_list("loop_state", flat=True):
            STATS[f"feature {state}"] += 1
        STATS["fix features"] += MissionFeature.objects.filter(
            mission=self.mission, generated_from__isnull=False
        ).count()
        STATS["slices complete"] += Slice.objects.filter(mission=self.mission, status=SliceStatus.COMPLETE).count()
        STATS["milestones complete"] += Milestone.objects.filter(
            mission=self.mission, status=MilestoneStatus.COMPLETE
        ).count()
        STATS["missions complete"] += Mission.objects.filter(pk=self.mission.pk, status=MissionStatus.COMPLETE).count()
        STATS["refusals"] += len(self.refused)
        for line in self.refused:
            what, _, rest = line.partition(": ")
            STATS[f"refused {what.split()[0]} {rest.split()[0]}"] += 1
        for p in MissionEvent.objects.filter(mission=self.mission, type="follow-up:refused").values_list(
            "payload", flat=True
        ):
            STATS[f"follow-up refused: {p.get('step')} {p.get('code')}"] += 1
        for p in MissionEvent.objects.filter(
            mission=self.mission, type="task:updated", payload__has_key="warning"
        ).values_list("payload", flat=True):
            STATS[f"task outcome not judged: {p['warning'].split(';')[0][:50]}"] += 1
        STATS["illegal transitions"] += len(self.illegal)
        for line in self.illegal:
            STATS[f"ILLEGAL {line[:160]}"] += 1

    # ------------------------------------------------------------ helpers

    def _has(self, qs, field: str = "mission") -> bool:
        return self.mission is not None and qs.filter(**{field: self.mission.pk}).exists()

    def _feature(self, data, **filters) -> MissionFeature | None:
        keys = list(
            MissionFeature.objects.filter(mission=self.mission, **filters).order_by("id").values_list("key", flat=True)
        )
        if not keys:
            return None
        key = data.draw(st.sampled_from(keys), label="feature")
        return MissionFeature.objects.select_related("mission").get(mission=self.mission, key=key)

    def _refused(self, what: str, exc: DomainError) -> None:
        (self.illegal if isinstance(exc, IllegalTransition) else self.refused).append(f"{what}: {exc.code} {exc}")

    def _linked(self, feature: MissionFeature) -> list[ContractAssertion]:
        return list(feature.assertions.filter(scope=AssertionScope.FEATURE).order_by("key"))

    def _describe(self, message: Message) -> str:
        if message.actor == "run_validator":
            run = ValidatorRun.objects.filter(pk=message.args[0]).select_related("feature", "milestone").first()
            if run is not None:
                what = run.feature.key if run.feature_id else f"milestone {run.milestone.key}"
                return (
                    f"run_validator(run {run.pk} of {what} at {run.revision[:8]} "
                    f"[{self.kinds.get(run.revision, 'base')}], now {run.status})"
                )
        if message.actor == "process_task_outcome":
            task = Task.objects.filter(pk=message.args[0]).select_related("feature").first()
            if task is not None:
                return f"process_task_outcome(task {task.pk} of {task.feature.key}, {task.status})"
        return repr(message)

    def _deliver(self, message: Message) -> None:
        note(f"deliver {self._describe(message)}")
        if (
            message.actor == "run_validator"
            and Mission.objects.filter(pk=self.mission.pk).exclude(credentials_env="").exists()
        ):
            STATS["run_validator delivered with credentials"] += 1
        actor = dramatiq.get_broker().get_actor(message.actor)
        started = time.monotonic()
        try:
            actor.fn(*message.args, **message.kwargs)
        except DomainError as exc:
            self._refused(f"deliver {message}", exc)
            # A failed actor is retried by Dramatiq (max_retries), as a fresh message.
            if message.attempt < actor.options.get("max_retries", 0):
                self.pending.append(Message(message.actor, message.args, message.kwargs, message.attempt + 1))
        finally:
            TIMES[f"actor {message.actor}"] += time.monotonic() - started
        self.delivered.append(message)

    # ------------------------------------------------------------ implementation and tasks

    KINDS = (
        "correct",
        "correct",
        "correct",
        "correct",
        "own_tests",
        "wrong",
        "rewrite",
        "subvert",
        "runner_config",
    )

    @rule(
        data=st.data(),
        kind=st.sampled_from(KINDS),
        naming=st.sampled_from(("sha", "main", "HEAD", "sha", "old")),
    )
    @_counted
    def complete(self, data, kind, naming):
        """Complete the open task of a feature (made first with `task_create` when it has
        none): a correct implementation, a correct one that adds its own test under the
        protected `tests/` (`own_tests`), a wrong one, one that rewrites a protected test to
        always pass and leaves the implementation wrong, one whose module subverts the test
        process from inside (`subvert`), or one that adds or edits the test runner's
        configuration (`runner_config`); named by its commit id, `main` or `HEAD`, or
        (`old`) an earlier commit id of the repository."""
        tasked = Task.objects.filter(mission=self.mission, status__in=OPEN_TASK).values_list("feature_id", flat=True)
        feature = (
            self._feature(data, pk__in=list(tasked))
            if tasked and data.draw(st.booleans(), label="an open task")
            else self._feature(data, loop_state__in=[s for s in LoopState.values if s != LoopState.SUPERSEDED])
        )
        if feature is None:
            return
        task = feature.tasks.filter(status__in=OPEN_TASK).order_by("-id").first()
        if task is None:
            try:
                task = task_create(user=None, feature=feature)
            except DomainError as exc:
                self._refused(f"task_create {feature.key}", exc)
                return
            note(f"task_create {feature.key} -> task {task.pk}")
        if naming == "old":
            revision = data.draw(st.sampled_from(self.history.order), label="old revision")
        else:
            changes = self._implementation(data, feature, kind)
            sha = self.history.commit(changes, f"{kind} {feature.key}")
            self.kinds[sha] = f"{kind} {feature.key}"
            STATS[f"commit {kind}"] += 1
            revision = {"sha": sha, "main": "main", "HEAD": "HEAD"}[naming]
        note(f"complete task {task.pk} of {feature.key} at {revision[:8]} ({self.kinds.get(self.history.head, 'old')})")
        try:
            task_complete(user=None, task=task, revision=revision, summary=f"{kind} implementation")
        except DomainError as exc:
            self._refused(f"complete task {task.pk}", exc)

    def _implementation(self, data, feature: MissionFeature, kind: str) -> dict[str, str | None]:
        linked = self._linked(feature)
        keys = [a.key for a in linked]
        # An implementation that does not tamper restores the tests, the runner
        # configuration and the modules the tests import, and drops a root conftest.
        changes: dict[str, str | None] = {**model.HONEST, "conftest.py": None}
        milestone = ContractAssertion.objects.filter(mission=self.mission, scope=AssertionScope.MILESTONE).first()
        if kind == "own_tests":  # correct, and its own test under the protected folder
            changes[f"tests/test_mine_{len(self.history.order)}.py"] = model.OWN_TEST
        if kind in ("correct", "own_tests"):
            for a in linked:
                changes[f"{a.key}.txt"] = model.correct_text(a.key, model.variant_of(a.check_spec))
            if milestone is not None:
                changes[f"{milestone.key}.txt"] = model.correct_text(
                    milestone.key, model.variant_of(milestone.check_spec)
                )
        elif kind == "wrong":
            wrong = data.draw(st.sets(st.sampled_from(keys), min_size=1), label="wrong keys") if keys else set()
            for a in linked:
                changes[f"{a.key}.txt"] = (
                    model.wrong_text(a.key)
                    if a.key in wrong
                    else model.correct_text(a.key, model.variant_of(a.check_spec))
                )
            if milestone is not None and data.draw(st.booleans(), label="break the milestone assertion"):
                changes[f"{milestone.key}.txt"] = model.wrong_text(milestone.key)
        elif kind == "rewrite":
            for key in keys:
                changes[f"{key}.txt"] = model.wrong_text(key)
            # Aimed at the checks that the tampering defeats, else at the first key.
            aimed = [a.key for a in linked if model.variant_of(a.check_spec) in ("protected", "pytest")]
            for key in aimed or keys[:1] or ["a1"]:
                changes[f"tests/check_{key}.py"] = model.ALWAYS_PASSES
                changes[f"tests/test_{key}.py"] = "def test_done():\n    pass\n"
        else:
            # An adversary that does the easy parts right: the checks its subversion
            # defeats (pytest's) stay wrong, the others are met.
            aimed = [a.key for a in linked if model.variant_of(a.check_spec) == "pytest"] or keys[:1] or ["a1"]
            for a in linked:
                changes[f"{a.key}.txt"] = (
                    model.wrong_text(a.key)
                    if a.key in aimed
                    else model.correct_text(a.key, model.variant_of(a.check_spec))
                )
            if kind == "subvert":
                form = data.draw(st.sampled_from(sorted(model.SUBVERSIONS)), label="subversion")
                STATS[f"commit subvert by {form}"] += 1
                for key in aimed:
                    changes[f"{key}_impl.py"] = model.SUBVERSIONS[form]
            else:
                form = data.draw(st.sampled_from(sorted(model.RUNNER_SUBVERSIONS)), label="runner configuration")
                STATS[f"commit runner_config by {form}"] += 1
                changes.update(model.RUNNER_SUBVERSIONS[form])
        return changes

    def _create_task(self, data):
        """`task_create` for a feature without an open task (roots and fixes alike)."""
        busy = Task.objects.filter(mission=self.mission, status__in=OPEN_TASK).values_list("feature_id", flat=True)
        feature = self._feature(
            data, **{"pk__in": MissionFeature.objects.filter(mission=self.mission).exclude(pk__in=list(busy))}
        )
        if feature is None:
            return
        try:
            task_create(user=None, feature=feature)
        except DomainError as exc:
            self._refused(f"task_create {feature.key}", exc)

    @precondition(lambda self: self.mission is not None and not self.finished)
    @rule()
    @_counted
    def finish(self):
        """Once per example, at a moment hypothesis chooses: the implementers catch up.
        Every open task (and, when nobody runs the mission, every idle or failed feature)
        gets a correct implementation and every queued message is delivered, for a few
        rounds: the deep states (slices, milestone runs, a complete mission) are reached
        from whatever the steps before left behind, and the steps after act on them."""
        self.finished = True
        mission = Mission.objects.get(pk=self.mission.pk)
        if mission.status == MissionStatus.PLANNING:
            self._activate(None)
        for _ in range(3):
            progressed = False
            for feature in (
                MissionFeature.objects.filter(mission=mission)
                .exclude(loop_state__in=[*DONE, LoopState.BLOCKED])
                .order_by("id")
            ):
                task = feature.tasks.filter(status__in=OPEN_TASK).order_by("-id").first()
                if (
                    task is None
                    and not mission.autopilot
                    and feature.loop_state in (LoopState.IDLE, LoopState.NEEDS_FIX)
                ):
                    try:
                        task = task_create(user=None, feature=feature)
                    except DomainError as exc:
                        self._refused(f"task_create {feature.key}", exc)
                if task is None:
                    continue
                sha = self.history.commit(self._implementation(None, feature, "correct"), f"correct {feature.key}")
                self.kinds[sha] = f"correct {feature.key}"
                note(f"finish: complete task {task.pk} of {feature.key} at {sha[:8]} (correct {feature.key})")
                try:
                    task_complete(user=None, task=task, revision=sha, summary="correct implementation")
                    progressed = True
                except DomainError as exc:
                    self._refused(f"complete task {task.pk}", exc)
            progressed |= bool(self.pending)
            self._drain(60)
            if not progressed:
                break

    # ------------------------------------------------------------ operators and edits
    # One rule draws the action, so that these (always possible) actions do not crowd out
    # the ones that make progress: hypothesis still chooses every one of them.

    OPERATIONS = (
        "validate",
        "create_task",
        "repair_clear",
        "repair_re_run",
        "link",
        "unlink",
        "edit_check",
        "activate",
        "advance",
        "grow",
        "credentials",
    )

    @rule(data=st.data(), action=st.sampled_from(OPERATIONS))
    @_counted
    def operate(self, data, action):
        STATS[f"operate {action}"] += 1
        getattr(self, f"_{action}")(data)

    def _validate(self, data):
        feature = self._feature(data)
        try:
            operator.feature_validate(feature=feature, user=None)
        except DomainError as exc:
            self._refused(f"validate {feature.key}", exc)

    def _repair_clear(self, data):
        self._repair(data, "clear")

    def _repair_re_run(self, data):
        self._repair(data, "re_run")

    def _repair(self, data, mode):
        feature = self._feature(data)
        try:
            operator.feature_repair(feature=feature, user=None, mode=mode)
        except DomainError as exc:
            self._refused(f"repair {mode} {feature.key}", exc)

    def _link(self, data):
        feature = self._feature(data)
        free = list(
            ContractAssertion.objects.filter(mission=self.mission, scope=AssertionScope.FEATURE)
            .exclude(feature_links__feature=feature)
            .order_by("key")
            .values_list("key", flat=True)
        )
        if not free:
            return
        assertion = ContractAssertion.objects.get(
            mission=self.mission, key=data.draw(st.sampled_from(free), label="assertion")
        )
        try:
            hierarchy.assertion_link(user=None, feature=feature, assertion=assertion)
        except DomainError as exc:
            self._refused(f"link {assertion.key} to {feature.key}", exc)

    def _unlink(self, data):
        feature = self._feature(data)
        linked = [a.key for a in self._linked(feature)]
        if not linked:
            return
        assertion = ContractAssertion.objects.get(
            mission=self.mission, key=data.draw(st.sampled_from(linked), label="assertion")
        )
        try:
            hierarchy.assertion_unlink(user=None, feature=feature, assertion=assertion)
        except DomainError as exc:
            self._refused(f"unlink {assertion.key} from {feature.key}", exc)

    def _edit_check(self, data):
        keys = list(
            ContractAssertion.objects.filter(mission=self.mission).order_by("key").values_list("key", flat=True)
        )
        assertion = ContractAssertion.objects.get(
            mission=self.mission, key=data.draw(st.sampled_from(keys), label="assertion")
        )
        # Never to a pytest check (a third of the examples start with one: its cost).
        variants = [
            v for v in model.VARIANTS if v != "pytest" and model.check_spec(assertion.key, v) != assertion.check_spec
        ]
        spec = model.check_spec(assertion.key, data.draw(st.sampled_from(variants), label="new check"))
        try:
            hierarchy.assertion_update(user=None, assertion=assertion, check_spec=spec)
        except DomainError as exc:
            self._refused(f"edit {assertion.key}", exc)

    def _activate(self, data):
        try:
            lifecycle.mission_activate(mission=Mission.objects.get(pk=self.mission.pk), user=None)
        except DomainError as exc:
            self._refused("activate", exc)

    def _advance(self, data):
        """`autopilot_advance(mission_id=)` called directly (what a sweep or a test does)."""
        try:
            autopilot_advance(mission_id=self.mission.pk)
        except DomainError as exc:
            self._refused("autopilot_advance", exc)

    GROWTH = ("feature", "slice", "milestone", "move")
    GROWN = 2  # new features per example at most: each is more runs

    def _grow(self, data):
        """New work, through the services the API uses: a feature (linked to an existing
        assertion) in an existing slice, a slice with its feature in an existing milestone,
        a milestone with a slice and a feature, or a feature moved to another slice. Work
        added under a complete node reopens it: `complete_done` holds after each."""
        how = data.draw(st.sampled_from(self.GROWTH), label="growth")
        STATS[f"grow {how}"] += 1
        try:
            if how == "move":
                self._move_feature(data)
                return
            if self.grown >= self.GROWN:
                return
            if how == "feature":
                slice_ = Slice.objects.get(mission=self.mission, key=self._draw_key(data, Slice, "slice", SliceStatus))
            else:
                if how == "milestone":
                    n = Milestone.objects.filter(mission=self.mission).count() + 1
                    milestone = hierarchy.milestone_create(
                        user=None, mission=self.mission, key=f"m{n}", title=f"Milestone {n}", order=n
                    )
                else:
                    milestone = Milestone.objects.get(
                        mission=self.mission, key=self._draw_key(data, Milestone, "milestone", MilestoneStatus)
                    )
                n = Slice.objects.filter(mission=self.mission).count() + 1
                slice_ = hierarchy.slice_create(
                    user=None, milestone=milestone, key=f"s{n}", title=f"Slice {n}", order=n
                )
            self._new_feature(data, slice_)
        except DomainError as exc:
            self._refused(f"grow {how}", exc)

    def _draw_key(self, data, model_class, label: str, statuses, exclude=None) -> str | None:
        """A slice's or milestone's key, a complete one in half of the draws when there is
        one: work added under a complete node is what the moves are about."""
        rows = model_class.objects.filter(mission=self.mission).exclude(pk=exclude).order_by("id")
        complete = list(rows.filter(status=statuses.COMPLETE).values_list("key", flat=True))
        if complete and data.draw(st.booleans(), label=f"a complete {label}"):
            return data.draw(st.sampled_from(complete), label=label)
        keys = list(rows.values_list("key", flat=True))
        return data.draw(st.sampled_from(keys), label=label) if keys else None

    def _new_feature(self, data, slice_: Slice) -> None:
        keys = list(
            ContractAssertion.objects.filter(mission=self.mission, scope=AssertionScope.FEATURE)
            .order_by("key")
            .values_list("key", flat=True)
        )
        assertion = ContractAssertion.objects.get(
            mission=self.mission, key=data.draw(st.sampled_from(keys), label="assertion")
        )
        self.grown += 1
        key = f"n{self.grown}"
        hierarchy.feature_create(
            user=None,
            slice_=slice_,
            assertions=[assertion],
            key=key,
            title=f"Feature {key}",
            description=f"Build {key}.",
            order=10 + self.grown,
        )
        note(f"grow: feature {key} {{{assertion.key}}} in slice {slice_.key} of milestone {slice_.milestone.key}")

    def _move_feature(self, data) -> None:
        feature = self._feature(data)
        key = self._draw_key(data, Slice, "to slice", SliceStatus, exclude=feature.slice_id)
        if key is None:
            return
        target = Slice.objects.get(mission=self.mission, key=key)
        note(f"move {feature.key} ({feature.loop_state}) from slice {feature.slice.key} to {target.key}")
        hierarchy.feature_update(user=None, feature=feature, slice=target)

    def _credentials(self, data):
        """The mission's `credentials_env` toggled between none and a variable the
        deployment allows for its repository: its runs read the repository through two
        mirrors by turns (a mirror per source and credential identity). Now and then a
        variable it does not allow, which is refused and changes nothing."""
        mission = Mission.objects.get(pk=self.mission.pk)
        new = "" if mission.credentials_env else data.draw(st.sampled_from(CREDENTIALS), label="variable")
        STATS[f"credentials {new or 'cleared'}"] += 1
        try:
            hierarchy.mission_update(mission=mission, user=None, credentials_env=new)
        except DomainError as exc:
            self._refused("credentials", exc)
            self._check(
                "credentials",
                new != TOKEN_ENV and exc.code == "credentials_not_allowed",
                f"credentials_env {new!r} refused: {exc.code} {exc}",
            )
        else:
            self._check("credentials", new != "SECRET_KEY", "credentials_env 'SECRET_KEY' was accepted")
        now = Mission.objects.values_list("credentials_env", flat=True).get(pk=mission.pk)
        self._check("credentials", now in ("", TOKEN_ENV), f"the mission's credentials_env is {now!r}")

    # ------------------------------------------------------------ delivery

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    @_counted
    def deliver(self, data):
        """One queued message, any of them (out of order is allowed)."""
        self._deliver(self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1), label="message #")))

    @precondition(lambda self: self.pending)
    @rule(limit=st.integers(1, 40))
    @_counted
    def deliver_all(self, limit):
        """A worker catching up: first in, first out, follow-ups included, `limit` at most."""
        self._drain(limit)

    def _drain(self, limit: int) -> None:
        for _ in range(limit):
            if not self.pending:
                return
            self._deliver(self.pending.pop(0))

    # ------------------------------------------------------------ faults: duplicates, late messages, dead workers

    FAULTS = ("deliver_twice", "late_delivery", "worker_death", "zombie_finishes", "reap_and_recover")

    @rule(data=st.data(), fault=st.sampled_from(FAULTS))
    @_counted
    def fault(self, data, fault):
        STATS[f"fault {fault}"] += 1
        getattr(self, f"_{fault}")(data)

    def _deliver_twice(self, data):
        """Duplicate delivery: the same message handled twice in a row."""
        if not self.pending:
            return
        message = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1), label="message #"))
        self._deliver(message)
        self._deliver(message)

    def _late_delivery(self, data):
        """A message delivered again later (a redelivery after a lost ack): a run message,
        a task outcome, an autopilot kick."""
        actors = sorted({m.actor for m in self.delivered})
        if not actors:
            return
        actor = data.draw(st.sampled_from(actors), label="redelivered actor")  # each kind as likely as the others
        messages = [m for m in self.delivered if m.actor == actor]
        self._deliver(messages[data.draw(st.integers(0, len(messages) - 1), label="delivered message #")])

    def _worker_death(self, data):
        """A worker claims a running run and dies before judging it."""
        runs = list(
            ValidatorRun.objects.filter(mission=self.mission, status=RunStatus.RUNNING, claim_token="")
            .order_by("id")
            .values_list("pk", flat=True)
        )
        if not runs:
            return
        # Drawn by position: run ids differ from one example to the next.
        run, _token = runner._claim(runs[data.draw(st.integers(0, len(runs) - 1), label="running run #")])
        if run is not None:
            note(f"worker died holding run {run.pk} of {run.feature.key if run.feature_id else 'the milestone'}")
            self.dead.append(run.pk)

    def _zombie_finishes(self, data):
        """The "dead" worker was only slow: it judges and records, maybe after the reap."""
        if not self.dead:
            return
        run_id = self.dead.pop(data.draw(st.integers(0, len(self.dead) - 1), label="dead run #"))
        run = ValidatorRun.objects.select_related("mission", "feature", "milestone").get(pk=run_id)
        note(f"the worker of run {run_id} was only slow: it records its verdict now (run is {run.status})")
        runner._judge_and_record(run)

    def _reap_and_recover(self, data):
        """The sweep, with a clock past every lease: reap, then re-drive from the database."""
        later = timezone.now() + timedelta(seconds=django_settings.FUSION_RUN_LEASE_SECONDS + 1)
        try:
            reap_runs(now=later)
            recover()
        except DomainError as exc:
            self._refused("recover", exc)

    # ------------------------------------------------------------ invariants (the database only)

    def _check(self, name: str, ok: bool, message: str) -> None:
        if not ok and name not in SKIP:
            raise AssertionError(f"[{name}] {message}")

    @invariant()
    def assert_truth(self):
        """Every invariant, after every step, from what the database holds (and the test's
        own model of what each commit contains)."""
        if self.mission is None:
            return
        started = time.monotonic()
        try:
            self._truth()
        finally:
            TIMES["invariants"] += time.monotonic() - started

    def _truth(self):
        STATS["steps"] += 1
        self.steps += 1
        mission = Mission.objects.get(pk=self.mission.pk)
        features = list(MissionFeature.objects.filter(mission=mission).select_related("last_run").order_by("id"))
        links: dict[int, dict[str, dict]] = {f.pk: {} for f in features}
        for feature_id, key, check in FeatureAssertion.objects.filter(
            feature__mission=mission, assertion__scope=AssertionScope.FEATURE
        ).values_list("feature_id", "assertion__key", "assertion__check_spec"):
            links[feature_id][key] = check
        runs = list(
            ValidatorRun.objects.filter(mission=mission).values_list(
                "pk", "feature_id", "status", "assertions", "revision", "error"
            )
        )
        self._passed_means_true(features, links)
        self._complete_means_done(mission, features, links)
        self._one_running_run(features, runs)
        self._failure_has_fix(mission, features)
        self._budgets(mission, features)
        self._runs_are_frozen(runs)
        self._protected_fail_is_true()

    def _passed_means_true(self, features: list[MissionFeature], links) -> None:
        """(a) A passed feature: its last run passed, over the feature's current contract
        (a contract change takes a passed feature out of `passed`: operator.
        revalidate_changed_contracts), at the revision it stands on, and every check it was
        judged by truly holds there. THE property: no false pass."""
        for f in features:
            if f.loop_state != LoopState.PASSED:
                continue
            run = f.last_run
            self._check(
                "passed_run",
                run is not None and run.status == RunStatus.PASSED,
                f"{f.key} is passed but its last run is {run and (run.pk, run.status)}",
            )
            if run is None:
                continue
            judged = {a["key"]: a["check"] for a in run.assertions}
            self._check(
                "stale_pass",
                judged == links[f.pk],
                f"{f.key} is passed by run {run.pk} over {judged}, but its contract is now {links[f.pk]}",
            )
            tree = self.history.tree(run.revision)
            false = [a["key"] for a in run.assertions if not model.check_holds(a["check"], tree)]
            self._check(
                "false_pass",
                not false,
                f"FALSE PASS: {f.key} passed at {run.revision[:10]} (run {run.pk}, trigger {run.trigger}) "
                f"although {false} do not hold there ({self.kinds.get(run.revision, 'base')})",
            )
            stands_on = feature_revision(f)
            if stands_on and stands_on != run.revision:
                tree = self.history.tree(stands_on)
                false = [a["key"] for a in run.assertions if not model.check_holds(a["check"], tree)]
                self._check(
                    "false_pass_standing",
                    not false,
                    f"FALSE PASS: {f.key} is passed (run {run.pk} at {run.revision[:10]}) and stands on "
                    f"{stands_on[:10]} ({self.kinds.get(stands_on, 'base')}) where {false} do not hold",
                )
                self._check(
                    "stands_on",
                    False,
                    f"{f.key} passed at {run.revision[:10]} (run {run.pk}, {self.kinds.get(run.revision, 'base')}) "
                    f"but stands on {stands_on[:10]} ({self.kinds.get(stands_on, 'base')})",
                )

    def _complete_means_done(self, mission: Mission, features: list[MissionFeature], links) -> None:
        """(b) Nothing is complete while a feature under it is not passed or superseded. And
        (docs/TRUTH.md, the code owners' rule) a passed feature whose linked set or checks
        changed after its pass does not count for the completion of its milestone or
        mission, and a complete milestone has a passed milestone run over exactly its
        current assertion set, at a revision where they truly hold."""
        slices = list(
            Slice.objects.filter(mission=mission).values_list(
                "pk", "key", "status", "milestone_id", "milestone__status"
            )
        )
        for pk, key, status, _m, _ms in slices:
            if status == SliceStatus.COMPLETE:
                open_ = [(f.key, f.loop_state) for f in features if f.slice_id == pk and f.loop_state not in DONE]
                self._check("complete_done", not open_, f"slice {key} is complete with {open_} not done")
        complete = {m for _, _, _, m, ms in slices if ms == MilestoneStatus.COMPLETE}
        if mission.status != MissionStatus.COMPLETE and not complete:
            return
        slice_milestone = {pk: m for pk, _, _, m, _ in slices}
        for m in Milestone.objects.filter(mission=mission):
            if m.status != MilestoneStatus.COMPLETE and mission.status != MissionStatus.COMPLETE:
                continue
            what = f"milestone {m.key} ({m.status}, mission {mission.status})"
            under = [f for f in features if slice_milestone[f.slice_id] == m.pk]
            open_ = [(f.key, f.loop_state) for f in under if f.loop_state not in DONE]
            self._check("complete_done", not open_, f"{what} is complete with {open_} not done")
            self._check(
                "complete_done", m.status == MilestoneStatus.COMPLETE, f"the mission is complete, {what} is not"
            )
            stale = [
                f.key
                for f in under
                if f.loop_state == LoopState.PASSED
                and {a["key"]: a["check"] for a in f.last_run.assertions} != links[f.pk]
            ]
            self._check(
                "stale_completion",
                not stale,
                f"{what} counts {stale} as passed although their linked assertions or checks changed since their pass",
            )
            current = {a.key: a.check_spec for a in m.assertions.all()}
            if not current:
                continue
            passed = ValidatorRun.objects.filter(
                milestone=m, scope=RunScope.MILESTONE, status=RunStatus.PASSED
            ).order_by("-id")
            matching = [r for r in passed if {a["key"]: a["check"] for a in r.assertions} == current]
            self._check(
                "milestone_run_current",
                bool(matching),
                f"{what} is complete without a passed milestone run over its current assertions {sorted(current)}",
            )
            for run in matching[:1]:
                false = [
                    a["key"]
                    for a in run.assertions
                    if not model.check_holds(a["check"], self.history.tree(run.revision))
                ]
                self._check(
                    "false_pass",
                    not false,
                    f"FALSE PASS: milestone run {run.pk} passed at {run.revision[:10]} "
                    f"although {false} do not hold there",
                )

    def _one_running_run(self, features: list[MissionFeature], runs) -> None:
        """(c) At most one running run per feature; and a feature is `validating` exactly
        while its last run is running (no orphan run, no feature waiting for nothing)."""
        running = [
            (pk, feature_id)
            for pk, feature_id, status, *_ in runs
            if status == RunStatus.RUNNING and feature_id is not None
        ]
        by_feature = [f for _, f in running]
        self._check(
            "one_running", len(by_feature) == len(set(by_feature)), f"two running runs for one feature: {running}"
        )
        for f in features:
            if f.loop_state == LoopState.VALIDATING:
                self._check(
                    "validating_has_run",
                    f.last_run is not None and f.last_run.status == RunStatus.RUNNING,
                    f"{f.key} is validating but its last run is {f.last_run and (f.last_run.pk, f.last_run.status)}",
                )
        last = {f.pk: (f.key, f.last_run_id, f.loop_state) for f in features}
        for run_id, feature_id in running:
            key, last_run, state = last[feature_id]
            self._check(
                "validating_has_run",
                last_run == run_id and state == LoopState.VALIDATING,
                f"run {run_id} of {key} is running but {key} is {state} with last run {last_run}",
            )

    def _failure_has_fix(self, mission: Mission, features: list[MissionFeature]) -> None:
        """(d) With auto_fix, a feature whose last run failed and that waits for a fix
        (needs_fix, or implementing it) has exactly one fix lineage for that failure, or is
        blocked with its budget used up (then it is not waiting). Adapted to the code: a
        repair `clear` starts the feature over, so the failure before it no longer calls
        for a fix."""
        if not mission.auto_fix:
            return
        for f in features:
            if (
                f.loop_state not in (LoopState.NEEDS_FIX, LoopState.IMPLEMENTING)
                or f.last_run is None
                or f.last_run.status != RunStatus.FAILED
            ):
                continue
            lineages = FixLineage.objects.filter(source=f, run_id=f.last_run_id).count()
            if lineages == 1:
                continue
            last = (
                MissionEvent.objects.filter(
                    mission=mission, type="feature:updated", payload__feature=f.pk, payload__has_key="cause"
                )
                .order_by("-seq")
                .first()
            )
            cause = last.payload["cause"] if last else ""
            self._check(
                "fix_for_failure",
                lineages == 0 and cause == "clear",
                f"{f.key} ({f.loop_state}, entered by {cause!r}) failed in run {f.last_run_id} "
                f"({f.last_run.scope}) and has {lineages} fix lineages for that failure",
            )

    def _budgets(self, mission: Mission, features: list[MissionFeature]) -> None:
        """(e) 0 <= fix_rounds <= retry_budget, and fix_rounds counts the fix rounds the
        audit log shows created for the root since its last `clear`."""
        events = MissionEvent.objects.filter(
            mission=mission, seq__gt=self.seen_seq, type__in=["fix-feature:created", "feature:updated"]
        ).order_by("seq")
        for seq, type_, p in events.values_list("seq", "type", "payload"):
            self.seen_seq = seq
            if type_ == "fix-feature:created":
                self.rounds[p["root"]] = self.rounds.get(p["root"], 0) + 1
                self._check("budget", p.get("budget_left", 0) >= 0, f"negative budget_left in {p}")
            elif p.get("cause") == "clear":
                self.rounds[p["feature"]] = 0
        budget = mission.retry_budget
        for f in features:
            created = self.rounds.get(f.pk, 0)
            self._check(
                "budget", 0 <= f.fix_rounds <= budget, f"{f.key} has fix_rounds {f.fix_rounds} > budget {budget}"
            )
            self._check(
                "budget",
                created == f.fix_rounds and created <= budget,
                f"{f.key}: {created} fix rounds created since its last clear, fix_rounds {f.fix_rounds}, "
                f"budget {budget}",
            )

    def _runs_are_frozen(self, runs) -> None:
        """(f) Every run froze a non-empty assertion set and a full commit id the test made;
        no run ended in a crash of the host's own code; every done task is pinned."""
        for pk, _feature, _status, assertions, revision, error in runs:
            self._check("frozen", bool(assertions), f"run {pk} froze no assertions")
            self._check(
                "frozen",
                bool(model.HEX40.match(revision)) and revision in self.history.trees,
                f"run {pk} has revision {revision!r}",
            )
            self._check("host_defect", not error.startswith("host_defect"), f"run {pk} crashed: {error[:800]}")
        for pk, revision in Task.objects.filter(mission=self.mission, status=TaskStatus.DONE).values_list(
            "pk", "revision"
        ):
            self._check("frozen", bool(model.HEX40.match(revision)), f"task {pk} done at {revision!r}")

    def _protected_fail_is_true(self) -> None:
        """(g) A verdict fails an assertion for changed protected files only at a commit that
        modified or deleted a protected file the base holds: tests an implementation adds
        are no tampering (they are set aside), and the base is the commit it was pinned to
        when it was set, not wherever its branch has moved since."""
        finished = (
            ValidatorRun.objects.filter(
                mission=self.mission, status__in=(RunStatus.PASSED, RunStatus.FAILED), reused_from__isnull=True
            )
            .exclude(pk__in=self.judged)
            .values_list("pk", "revision", "verdict")
        )
        for pk, revision, verdict in finished:
            self.judged.add(pk)
            named = [
                a["key"]
                for a in (verdict or {}).get("assertions", [])
                if a.get("verdict") == "fail" and protect.NOTE in a.get("message", "")
            ]
            self._check(
                "false_protected_fail",
                not named or model.protected_changed(self.history.tree(revision)),
                f"run {pk} at {revision[:10]} ({self.kinds.get(revision, 'base')}) failed {named} for changed "
                f"protected files, but the commit modified or deleted none that the base holds",
            )


def _no_worker(monkeypatch, tmp_path) -> None:
    """Messages are recorded, not sent; one template repository for the whole test."""
    monkeypatch.setattr(dramatiq.Actor, "send_with_options", _record)
    monkeypatch.setattr(dramatiq.Actor, "send", _record_send)
    # The audit log (MissionEvent) is written as always; only its live fan-out after commit
    # (event-stream storage and the Channels group: ~6 ms an event, a fifth of the time)
    # is left out. Nothing the invariants read depends on it.
    monkeypatch.setattr(delivery, "send_all", lambda events: None)
    monkeypatch.setenv(TOKEN_ENV, "truth-token")
    # The deployment allows the variable for the examples' repositories (local paths).
    monkeypatch.setattr(django_settings, "FUSION_GIT_CREDENTIALS", {TOKEN_ENV: [f"file://{tempfile.gettempdir()}/"]})
    TruthMachine.template = model.Template(tmp_path / "template-root")


def test_a_feature_passes_only_where_its_implementation_is_true(monkeypatch, tmp_path):
    _no_worker(monkeypatch, tmp_path)
    started = time.monotonic()
    try:
        run_state_machine_as_test(
            TruthMachine,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                derandomize=False,
                phases=list(Phase) if SHRINK else [Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
            ),
        )
    finally:
        print(f"\ntruth property: {EXAMPLES} examples x {STEPS} steps in {time.monotonic() - started:.1f}s")
        for name, count in sorted(STATS.items()):
            print(f"  {name}: {count}")
        for name, seconds in TIMES.most_common():
            print(f"  time in {name}: {seconds:.1f}s")


# ---------------------------------------------------------------- sequences the property found
# The same machine driven by hand through sequences the property test found (the draws
# hypothesis made, in order), every invariant checked after each step: each stays a fast,
# deterministic guard of its defect.


class Scripted:
    """The draws of a hand-written sequence, in the order the rules make them."""

    def __init__(self, *values):
        self.values = list(values)

    def draw(self, strategy, label=None):
        return self.values.pop(0)


class ByHand:
    """The machine driven through a fixed sequence, every invariant checked after each step
    as in the property test; a step that no longer applies (the code moved the feature
    elsewhere) does nothing."""

    def __init__(self, machine: TruthMachine):
        self.m = machine

    def __call__(self, step, *args):
        step(*args)
        self.m.assert_truth()

    def land(self, key: str, kind: str, *wrong: str, form: str = "") -> None:
        """`complete` for feature `key` (its open task, or a new one) at a new commit; `form`:
        of a `subvert` or `runner_config` implementation."""
        tasked = Task.objects.filter(mission=self.m.mission, status__in=OPEN_TASK)
        draws = [tasked.filter(feature__key=key).exists()] if tasked.exists() else []
        draws.append(key)
        if kind == "wrong":
            draws.append(set(wrong))
        if form:
            draws.append(form)
        self(self.m.complete, Scripted(*draws), kind, "sha")

    def deliver(self, actor: str, nth: int = 0) -> None:
        """The `nth` queued message of `actor` (out of order)."""
        indexes = [i for i, message in enumerate(self.m.pending) if message.actor == actor]
        if len(indexes) > nth:
            self(self.m.deliver, Scripted(indexes[nth]))


@pytest.fixture
def by_hand(monkeypatch, tmp_path):
    _no_worker(monkeypatch, tmp_path)
    m = TruthMachine()
    yield ByHand(m)
    m.teardown()


def _set_up(m: TruthMachine, **shape) -> None:
    """One milestone, f1 {a1} in s1 and f2 {a2} in s2, file checks, unless `shape` says otherwise."""
    TruthMachine.setup(
        m,
        **{
            "autopilot": False,
            "auto_fix": False,
            "budget": 1,
            "active": True,
            "per_slice": (1, 1),
            "per_feature": [1, 1, 1, 1],
            "variants": ["file"] * 9,
            "milestone_check": None,
            "spare": False,
            "may_finish": False,
            "pytest_at": None,
            "base_named": "sha",
            **shape,
        },
    )
    m.assert_truth()


def test_found_a_task_landing_while_its_feature_is_validating_is_judged(by_hand):
    """f1 validating at R1 (right); a second task lands R2 (wrong) and its outcome finds f1
    validating, so nothing judged R2; the run of R1 passed f1, which stood on R2."""
    do, m = by_hand, by_hand.m
    _set_up(m)
    do.land("f1", "correct")  # task 1 made, completed at R1
    do.deliver("process_task_outcome")  # f1 validating at R1
    do(m._create_task, Scripted("f1"))  # task 2, while f1 is validating
    do.land("f1", "wrong", "a1")  # completed at R2: a1 wrong
    do.deliver("process_task_outcome")  # task 2's outcome
    do.deliver("run_validator")  # the run of R1
    do(m.deliver_all, 20)
    m.assert_truth()  # as after every step above


def test_found_a_late_outcome_of_an_older_task_is_not_judged_at_its_old_revision(by_hand):
    """f1 passed at R1; a second task lands R2 (wrong); task 1's outcome message is delivered
    again (a redelivery): it was judged at task 1's revision, the earlier pass reused, and
    f1 was `passed` while it stood on R2, where a1 does not hold."""
    do, m = by_hand, by_hand.m
    _set_up(m)
    do.land("f1", "correct")  # task 1 at R1
    do(m.deliver_all, 20)  # f1 passed at R1
    do(m._create_task, Scripted("f1"))  # task 2
    do.land("f1", "wrong", "a1")  # task 2 at R2: a1 wrong
    do(m._late_delivery, Scripted("process_task_outcome", 0))  # task 1's outcome, again
    do(m.deliver_all, 20)
    m.assert_truth()  # as after every step above


def test_found_a_run_admitted_before_a_contract_edit_does_not_pass_the_old_contract(by_hand):
    """f1's run is queued with a1 = `done a1`; a1 is edited to `done a1 v2` before it runs.
    The run passed f1 on the old a1 and nothing judged f1 again; once f2 (linked to a1 too)
    landed `done a1 v2`, the milestone run passed and the mission completed, counting f1,
    whose pass was over a contract that no longer exists."""
    do, m = by_hand, by_hand.m
    _set_up(m, autopilot=True)
    do(m._link, Scripted("f2", "a1"))  # a1 is f2's too
    do(m.deliver_all, 40)  # the autopilot: s1 active, a task for f1
    do.land("f1", "correct")  # f1 at R1: done a1
    do.deliver("process_task_outcome")  # f1's run queued
    do(m._edit_check, Scripted("a1", "file_v2"))  # a1 now wants `done a1 v2`
    do(m.deliver_all, 40)  # f1's run; the autopilot
    do.land("f2", "correct")  # f2 at R2: done a1 v2, done a2
    do(m.deliver_all, 40)  # f2's run, the milestone run
    m.assert_truth()  # as after every step above


# ---------------------------------------------------------------- the implementation as an adversary, new and moved work


def _state(m: TruthMachine, key: str) -> str:
    return MissionFeature.objects.get(mission=m.mission, key=key).loop_state


def test_found_a_base_named_main_does_not_move_onto_the_judged_commit(by_hand):
    """The base is named `main` and the implementations commit onto `main`: f1 lands a
    commit that rewrites its protected test to always pass, and its run judged it against
    a base re-read as `main`, that commit itself: nothing had changed, the rewritten test
    ran, and f1 passed."""
    do, m = by_hand, by_hand.m
    _set_up(m, base_named="main", variants=["protected"] * 9)
    do.land("f1", "rewrite")
    do(m.deliver_all, 20)
    assert _state(m, "f1") != LoopState.PASSED


def test_found_a_base_named_main_that_moved_on_does_not_fail_an_honest_commit(by_hand):
    """The other way round: f1 lands an honest commit R1, then f2 a test-rewriting one on
    `main`; f1's run judged R1 against `main` re-read at admission (R2), and failed R1 for
    protected files it never touched."""
    do, m = by_hand, by_hand.m
    _set_up(m, base_named="main")
    do.land("f1", "correct")
    do.land("f2", "rewrite")
    do(m.deliver_all, 20)
    assert _state(m, "f1") == LoopState.PASSED


def assert_adversary_does_not_pass(do: ByHand, kind: str, form: str) -> None:
    """a1 is checked by a protected pytest test that imports f1's module `a1_impl.py`; f1
    lands a commit that leaves a1 wrong and subverts the test run by `form`."""
    _set_up(do.m, pytest_at=0)
    do.land("f1", kind, form=form)
    do(do.m.deliver_all, 20)
    assert _state(do.m, "f1") != LoopState.PASSED


@pytest.mark.parametrize("form", ["exit", "report", "stdlib"])
def test_found_an_implementation_that_subverts_the_test_process_does_not_pass(by_hand, form):
    """The module ends the process with exit 0 while pytest collects (`exit`: no test
    ran, exit status 0), rewrites every report of pytest to `passed` at import
    (`report`: the test failed and was reported passed), or makes `pathlib` answer what
    the test reads (`stdlib`: the test ran and passed): f1 passed."""
    assert_adversary_does_not_pass(by_hand, "subvert", form)


@pytest.mark.parametrize("form", ["conftest", "ini"])
def test_found_runner_configuration_that_passes_every_test_does_not_pass(by_hand, form):
    """f1 adds a root `conftest.py` (outside the protected `tests/**`) whose hook marks
    every report passed (`conftest`), or edits the base's `pytest.ini` to only collect
    (`ini`: nothing ran, exit status 0): f1 passed."""
    assert_adversary_does_not_pass(by_hand, "runner_config", form)


def test_found_a_feature_created_in_a_complete_slice_reopens_it(by_hand):
    """f1 passed and completed s1; a new feature (linked to a2) is made in s1 through the
    services the API uses: s1 stayed complete with the new feature idle."""
    do, m = by_hand, by_hand.m
    _set_up(m, autopilot=True)
    do(m.deliver_all, 40)  # the autopilot: s1 active, a task for f1
    do.land("f1", "correct")
    do(m.deliver_all, 40)
    assert Slice.objects.get(mission=m.mission, key="s1").status == SliceStatus.COMPLETE
    do(m.operate, Scripted("feature", True, "s1", "a2"), "grow")
    assert Slice.objects.get(mission=m.mission, key="s1").status != SliceStatus.COMPLETE


def test_found_a_feature_moved_into_a_complete_slice_reopens_it(by_hand):
    """f1 passed and completed s1; f2, not done, moved into s1: s1 stayed complete."""
    do, m = by_hand, by_hand.m
    _set_up(m, autopilot=True)
    do(m.deliver_all, 40)
    do.land("f1", "correct")
    do(m.deliver_all, 40)
    assert Slice.objects.get(mission=m.mission, key="s1").status == SliceStatus.COMPLETE
    do(m.operate, Scripted("move", "f2", True, "s1"), "grow")
    assert Slice.objects.get(mission=m.mission, key="s1").status != SliceStatus.COMPLETE


def test_work_added_under_a_complete_mission_reopens_it(by_hand):
    """Every feature passed and the mission completed; a new slice with a feature in m1,
    then a new milestone with a slice and a feature: the milestone and the mission reopen
    (the new feature's assertion link alone reopened them before work itself did)."""
    do, m = by_hand, by_hand.m
    _set_up(m, autopilot=True)
    do(m.finish)
    assert Mission.objects.get(pk=m.mission.pk).status == MissionStatus.COMPLETE
    do(m.operate, Scripted("slice", True, "m1", "a1"), "grow")
    assert Milestone.objects.get(mission=m.mission, key="m1").status != MilestoneStatus.COMPLETE
    m.finished = False
    do(m.finish)
    assert Mission.objects.get(pk=m.mission.pk).status == MissionStatus.COMPLETE
    do(m.operate, Scripted("milestone", "a2"), "grow")
    assert Mission.objects.get(pk=m.mission.pk).status != MissionStatus.COMPLETE


def test_runs_judged_through_a_mirror_per_credential_identity_keep_the_truth(by_hand):
    """f1's run reads the repository without credentials, f2's with an allowed variable,
    then f1's again without: each commit is judged where it truly holds."""
    do, m = by_hand, by_hand.m
    _set_up(m)
    do.land("f1", "correct")
    do(m.deliver_all, 20)
    do(m.operate, Scripted(TOKEN_ENV), "credentials")
    do.land("f2", "correct")
    do(m.deliver_all, 20)
    do(m.operate, Scripted(), "credentials")
    do(m._create_task, Scripted("f1"))
    do.land("f1", "wrong", "a1")
    do(m.deliver_all, 20)
    assert [_state(m, "f1"), _state(m, "f2")] == [LoopState.NEEDS_FIX, LoopState.PASSED]


def test_found_an_implementations_own_tests_do_not_fail_it(by_hand):
    """A correct f1 adds its own test under the protected `tests/`: it changed none of the
    tests the base holds, yet every assertion failed "the implementation changed protected
    files"."""
    do, m = by_hand, by_hand.m
    _set_up(m, variants=["file", "protected", "run", "file"] * 2 + ["file"], per_feature=[2, 1, 1, 1])
    do.land("f1", "own_tests")
    do(m.deliver_all, 20)
    assert _state(m, "f1") == LoopState.PASSED
