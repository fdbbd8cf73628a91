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
        from django_eddyq.metrics import enable_if_configured

        # Counts jobs for Prometheus when METRICS is on (imports prometheus_client only then).
        enable_if_configured()
