"""The `jobs` app: on ready, registers the system checks and imports every installed app's
`handlers.py` (autodiscovery, like admin.py), so each process knows every job kind.
"""

from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from jobs.core import registry
        from jobs.ops import checks  # noqa: F401  (registers system checks)

        registry.autodiscover()
