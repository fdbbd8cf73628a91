from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class EddyqConfig(AppConfig):
    name = "django_eddyq"
    label = "django_eddyq"
    verbose_name = _("Job queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks.
        from django_eddyq import checks  # noqa: F401
