"""`manage.py review`: ask for an advisory review, follow it, read its verified result.

    review --file request.json|yaml [field flags] [--mission M --feature F --revision R]
    review --objective … --change-summary … --scope … --criterion … (--evidence CHECK=OUTCOME | --not-run REASON)
    review --of-feature FEATURE          the request filled from a feature (id, key or MISSION/KEY)
    review --result ID | --cancel ID

`--sync` runs the pipeline in this process, `--wait` waits for a worker; both print the
verified report. Exit codes: 0 completed (or receipt only), 1 failed, 2 cancelled or
still running after --timeout.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from missions.errors import DomainError
from missions.management.cli import feature_by_ref
from validation.models import Review
from validation.review import artifacts
from validation.review.create import feature_review, review_create
from validation.review.pipeline import run_captured
from validation.review.state import TERMINAL, S, captured_stages, review_cancel

# By review state (a str: the choices compare and hash as their values).
EXIT: dict[str, int] = {S.COMPLETED: 0, S.FAILED: 1, S.CANCELLED: 2}
LISTS = {
    "background": "background",
    "scope": "scope",
    "criterion": "acceptanceCriteria",
    "known_limitation": "knownLimitations",
    "exclusion": "exclusions",
}
LIST_HELP = {
    "background": "context for the reviewers",
    "scope": "what to review (at least one)",
    "criterion": "an acceptance criterion (at least one)",
    "known_limitation": "a known limitation",
    "exclusion": "what not to review",
}


def _error(exc: DomainError) -> CommandError:
    lines = [exc.detail] + [f"  {path or '(body)'}: {'; '.join(msgs)}" for path, msgs in exc.fields.items()]
    if "expected_shape" in exc.extra:
        lines.append("  expected shape: " + json.dumps(exc.extra["expected_shape"], indent=2))
    return CommandError("\n".join(lines))


def _file_body(name: str) -> Any:
    raw = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    try:
        return yaml.safe_load(raw)  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        raise CommandError(f"{name} is neither JSON nor YAML: {exc}") from exc


def _apply_fields(body: dict[str, Any], o: dict[str, Any]) -> None:
    """The single-valued flags over the file's fields; ids given as digits become numbers."""
    for flag, key in (
        ("objective", "objective"),
        ("change_summary", "changeSummary"),
        ("mission", "mission"),
        ("revision", "revision"),
    ):
        if o[flag] is not None:
            body[key] = o[flag]
    if o["feature"] is not None:
        body["feature"] = int(o["feature"]) if o["feature"].isdigit() else o["feature"]
    if isinstance(body.get("mission"), str) and body["mission"].isdigit():
        body["mission"] = int(body["mission"])


def _verification(o: dict[str, Any]) -> dict[str, Any] | None:
    if o["evidence"]:
        pairs = [item.partition("=") for item in o["evidence"]]
        return {"status": "provided", "evidence": [{"check": c, "outcome": v} for c, _, v in pairs]}
    if o["not_run"] is not None:
        return {"status": "not_run", "reason": o["not_run"]}
    return None


class Command(BaseCommand):
    help = "Request an advisory review (or read / cancel one) and print its verified report."

    def add_arguments(self, parser):
        parser.add_argument("--file", help="request body as JSON or YAML ('-' for stdin)")
        parser.add_argument("--objective", help="what the change is meant to achieve")
        parser.add_argument("--change-summary", help="what was changed")
        for flag in LISTS:
            parser.add_argument(
                f"--{flag.replace('_', '-')}",
                action="append",
                default=None,
                dest=flag,
                help=f"{LIST_HELP[flag]} (repeatable)",
            )
        parser.add_argument("--evidence", action="append", default=None, help="CHECK=OUTCOME (repeatable)")
        parser.add_argument("--not-run", help="verification not run, with this reason")
        parser.add_argument("--mission", help="mission id or key")
        parser.add_argument("--feature", help="feature id (or key with --mission)")
        parser.add_argument("--revision", help="commit to review (default: the workspace HEAD)")
        parser.add_argument("--of-feature", help="fill the request from this feature (id, key or MISSION/KEY)")
        parser.add_argument("--profile", help="review profile (default: 'default')")
        parser.add_argument("--user", help="user name the review is recorded for")
        parser.add_argument("--idempotency-key", help="same key and request: the same review (needs --user)")
        parser.add_argument("--sync", action="store_true", help="run the pipeline in this process")
        parser.add_argument("--wait", action="store_true", help="wait for a worker to finish it")
        parser.add_argument("--timeout", type=float, default=1800, help="seconds --wait waits")
        parser.add_argument("--result", type=int, metavar="ID", help="print the verified result of a review")
        parser.add_argument("--cancel", type=int, metavar="ID", help="cancel a review")

    def handle(self, *args, **o):
        try:
            if o["result"]:
                return self._finish(self._get(o["result"]))
            if o["cancel"]:
                review = review_cancel(review=self._get(o["cancel"]))
                self.stdout.write(f"review {review.pk}: {review.state}")
                return None
            return self._request(o)
        except DomainError as exc:
            raise _error(exc) from exc

    def _get(self, pk: int) -> Review:
        review = Review.objects.filter(pk=pk).first()
        if review is None:
            raise CommandError(f"no review {pk}")
        return review

    def _request(self, o: dict[str, Any]) -> None:
        user = self._user(o["user"])
        if o["idempotency_key"] and user is None:
            raise CommandError("--idempotency-key needs --user: keys belong to a user")
        with captured_stages() if o["sync"] else _nothing() as queue:
            preflight = self._create(o, user)
            review = preflight.review
            receipt = artifacts.receipt(review)
            self.stdout.write(
                f"review {review.pk}: {review.state}"
                + ("" if preflight.created else " (same request and key: the existing review)")
            )
            self.stdout.write(
                f"result: {receipt['result_url']}"
                + (f"  events: {receipt['events_url']}" if receipt["events_url"] else "")
            )
            if queue is not None:
                run_captured(queue)
        if o["sync"] or o["wait"]:
            return self._finish(self._wait(review, o["timeout"]))
        return None

    def _create(self, o: dict[str, Any], user):
        kwargs = dict(user=user, idempotency_key=o["idempotency_key"], profile=o["profile"], source="cli")
        if o["of_feature"]:
            return feature_review(feature=feature_by_ref(o["of_feature"]), **kwargs)
        return review_create(body=self._body(o), unrestricted=user is None or user.is_staff, **kwargs)

    def _body(self, o: dict[str, Any]) -> Any:
        body: Any = _file_body(o["file"]) if o["file"] else {}
        if not isinstance(body, dict):
            return body  # the request rules report it
        _apply_fields(body, o)
        for flag, key in LISTS.items():
            if o[flag]:
                body[key] = list(body.get(key) or []) + o[flag]
        if not o["file"]:
            body.setdefault("background", [])  # may be empty; a file must say so itself
        verification = _verification(o)
        if verification is not None:
            body["verification"] = verification
        return body

    def _user(self, name: str | None):
        if not name:
            return None
        user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: name}).first()
        if user is None:
            raise CommandError(f"no user {name!r}")
        return user

    def _wait(self, review: Review, timeout: float) -> Review:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            review.refresh_from_db()
            if review.state in TERMINAL:
                return review
            time.sleep(0.5)
        raise CommandError(f"review {review.pk} is still {review.state} after {timeout:g}s (is a worker running?)")

    def _finish(self, review: Review) -> None:
        answer = artifacts.review_result(review)
        if not answer.get("ready"):
            self.stdout.write(
                f"review {review.pk}: {review.state}"
                + (f" ({answer.get('failure_code')}: {answer.get('reason')})" if answer.get("reason") else "")
            )
            raise SystemExit(EXIT.get(review.state, 2))
        report = answer["report"]
        text = (
            report["content"]
            if report["content"] is not None
            else artifacts.verified_artifact(review, report["name"]).content
        )
        self.stdout.write(text, ending="")
        self.stdout.write(f"\nreview {review.pk}: completed, verified (report sha256 {report['sha256']})")
        raise SystemExit(0)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
