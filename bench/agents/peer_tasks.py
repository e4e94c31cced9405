"""The no-op task of the django-tasks-db peer."""

from django.tasks import task


@task()
def noop() -> None:
    return None
