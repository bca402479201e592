"""Make sure a superuser exists, so a fresh `make run` can be logged into.

Idempotent: when any superuser exists nothing is changed. The password comes from
FUSION_ADMIN_PASSWORD or is generated; it is printed once, when the user is created.
"""

from __future__ import annotations

import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Create a superuser (FUSION_ADMIN_USER / FUSION_ADMIN_PASSWORD) and its API token if none exists."

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        username = getattr(settings, "FUSION_ADMIN_USER", "") or "admin"
        with transaction.atomic():
            admin = User.objects.filter(is_superuser=True).order_by("pk").first()
            if admin is not None:
                self.stdout.write("Admin user exists; not changed.")
            else:
                if User.objects.filter(**{User.USERNAME_FIELD: username}).exists():
                    # Promoting an existing ordinary account silently would hand out
                    # rights nobody asked for; make the operator choose.
                    raise CommandError(
                        f"A non-superuser named {username!r} exists; set FUSION_ADMIN_USER to another name "
                        f"or promote it with 'manage.py createsuperuser'."
                    )
                password = os.environ.get("FUSION_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
                admin = User.objects.create_superuser(**{User.USERNAME_FIELD: username}, email="", password=password)
                self.stdout.write(f"Created admin user '{username}' with password '{password}'")
            token, created = Token.objects.get_or_create(user=admin)
        if created:
            self.stdout.write(f"Created API token for '{admin.get_username()}': {token.key}")
