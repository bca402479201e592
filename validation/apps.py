from django.apps import AppConfig


class ValidationConfig(AppConfig):
    name = "validation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from validation import (
            checks,  # noqa: F401  (registers system checks)
            receivers,  # noqa: F401  (subscribes to the plan's hooks: missions/hooks.py)
            tasks,  # noqa: F401  (declares the actors that services send to by name)
        )
