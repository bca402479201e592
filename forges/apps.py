from django.apps import AppConfig


class ForgesConfig(AppConfig):
    name = "forges"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Forges"
