"""The `jobs` app: on ready, registers the system checks and imports every installed app's
`handlers.py` (autodiscovery, like admin.py), so each process knows every job kind; and loads the
configured `TASKS` backends, so that in a worker a Palisade backend can resolve a task's kind
(jobs.tasks.execution) before its module was imported.
"""

from django.apps import AppConfig
from django.tasks import task_backends


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from jobs.core import registry
        from jobs.ops import checks  # noqa: F401  (registers system checks)

        registry.autodiscover()
        task_backends.all()
