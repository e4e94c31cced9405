from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from jobs.core import registry
        from jobs.ops import checks  # noqa: F401  (registers system checks)

        registry.autodiscover()
