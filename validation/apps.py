from django.apps import AppConfig


class ValidationConfig(AppConfig):
    name = "validation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from validation import checks  # noqa: F401  (registers system checks)
