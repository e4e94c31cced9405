"""The `jobs` app: on ready, registers the system checks and imports every installed app's
`handlers.py` (autodiscovery, like admin.py), so each process knows every job kind; after every
`migrate`, installs the check a token-checked write's COMMIT makes on each FencedRow table
(jobs.effects.fenced.install_commit_checks); and loads the
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
        from django.db.models.signals import post_migrate

        from jobs.core import registry
        from jobs.effects.fenced import install_commit_checks
        from jobs.ops import checks  # noqa: F401  (registers system checks)

        # After every migrate: the check a token-checked write's COMMIT makes, on each FencedRow
        # table (the application's tables: no migration of ours creates them).
        post_migrate.connect(
            install_commit_checks, sender=self, dispatch_uid="jobs_fence_at_commit"
        )

        registry.autodiscover()
        task_backends.all()
