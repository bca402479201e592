"""`manage.py complete_task TASK --revision REV [--summary TEXT]`"""

from django.core.management.base import BaseCommand, CommandError

from missions.errors import DomainError
from missions.models import Task
from missions.services.tasks import task_complete


class Command(BaseCommand):
    help = "Record a task as done at a revision; its feature is then validated."

    def add_arguments(self, parser):
        parser.add_argument("task", type=int)
        parser.add_argument("--revision", required=True)
        parser.add_argument("--summary", default="")

    def handle(self, *args, task: int, revision: str, summary: str, **options):
        obj = Task.objects.filter(pk=task).first()
        if obj is None:
            raise CommandError(f"no task {task}")
        try:
            obj = task_complete(user=None, task=obj, revision=revision, summary=summary)
        except DomainError as exc:
            raise CommandError(exc.detail) from exc
        self.stdout.write(f"task {obj.pk} done at {obj.revision}; validation queued")
