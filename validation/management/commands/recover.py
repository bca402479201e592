import json

from django.core.management.base import BaseCommand

from validation.services.recovery import recover


class Command(BaseCommand):
    help = "Reap stale validator runs and re-drive every feature from its persisted state."

    def add_arguments(self, parser):
        parser.add_argument(
            "--startup", action="store_true", help="Treat every running run as orphaned (no worker is alive)."
        )

    def handle(self, *args, startup: bool, **options):
        report = recover(startup=startup)
        self.stdout.write(json.dumps(report, sort_keys=True))
