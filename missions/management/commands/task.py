"""`manage.py task create|start|complete|fail|log ...` — tasks by hand (the `manual`
executor), through the same services as the API and the admin.

    task create FEATURE [--title T] [--prompt TEXT | --prompt-file PATH]
    task start TASK
    task complete TASK --revision REV [--summary TEXT]
    task fail TASK [--reason TEXT]
    task log TASK

FEATURE is a feature id, key or MISSION/KEY; TASK a task id. Every subcommand takes
`--user NAME` (named in the audit log).

Exit codes: 0 done; 1 refused by the rules; 2 unknown feature, task or user.
"""

from __future__ import annotations

import pathlib

from django.core.management.base import BaseCommand, CommandError

from missions.errors import DomainError
from missions.management.cli import NOT_FOUND, add_user_argument, find_feature, find_task, find_user, refused
from missions.models import Task
from missions.services import tasks as services


def describe(task: Task) -> str:
    feature = f" for {task.mission.key}/{task.feature.key}" if task.feature else ""
    revision = f" at {task.revision}" if task.revision else ""
    return f"task {task.pk}{feature}: {task.status}{revision}"


class Command(BaseCommand):
    help = (
        "Create, start, complete or fail a task, or print its log. "
        "Exit codes: 0 done, 1 refused by the rules, 2 unknown feature, task or user."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{create,start,complete,fail,log}")
        create = sub.add_parser("create", help="create a task for a feature (links it; idle -> implementing)")
        create.add_argument("target", metavar="FEATURE", help="feature id, key or MISSION/KEY")
        create.add_argument("--title", default="")
        prompt = create.add_mutually_exclusive_group()
        prompt.add_argument(
            "--prompt", default="", help="the prompt (default: made from the feature and its assertions)"
        )
        prompt.add_argument("--prompt-file", default=None, help="read the prompt from this file")
        start = sub.add_parser("start", help="start a todo task (the command executor then runs it)")
        complete = sub.add_parser("complete", help="record the revision a task landed; its feature is validated")
        complete.add_argument("--revision", required=True)
        complete.add_argument("--summary", default="")
        fail = sub.add_parser("fail", help="end a task as failed")
        fail.add_argument("--reason", default="")
        log = sub.add_parser("log", help="print a task's log")
        for p in (start, complete, fail, log):
            p.add_argument("target", metavar="TASK", help="task id")
        for p in (create, start, complete, fail, log):
            add_user_argument(p)

    def handle(self, *args, subcommand: str, target: str, username: str | None = None, **options):
        user = find_user(username)
        if subcommand == "create":
            return self._create(find_feature(target), user, **options)
        task = find_task(target)
        if subcommand == "log":
            self.stdout.write(task.log, ending="" if task.log.endswith("\n") or not task.log else "\n")
            return
        try:
            if subcommand == "start":
                task = services.task_start(user=user, task=task)
            elif subcommand == "complete":
                task = services.task_complete(
                    user=user, task=task, revision=options["revision"], summary=options["summary"]
                )
            else:
                reason = options["reason"] or "failed from the command line"
                task = services.task_fail(user=user, task=task, reason=reason)
        except DomainError as exc:
            raise refused(exc, prefix=f"cannot {subcommand} task {task.pk}: ") from exc
        suffix = "; validation queued" if subcommand == "complete" else ""
        self.stdout.write(describe(task) + suffix)

    def _create(self, feature, user, *, title: str, prompt: str, prompt_file: str | None, **options) -> None:
        if prompt_file:
            try:
                prompt = pathlib.Path(prompt_file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise CommandError(f"cannot read {prompt_file}: {exc}", returncode=NOT_FOUND) from exc
        try:
            task = services.task_create(user=user, feature=feature, title=title, prompt=prompt)
        except DomainError as exc:
            raise refused(exc, prefix=f"cannot create a task for {feature.key}: ") from exc
        self.stdout.write(describe(task))
