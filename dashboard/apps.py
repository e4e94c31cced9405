"""The operations dashboard: screens only. Job kinds, the seed and the drill live in demo/."""

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Operations dashboard"

    def ready(self) -> None:
        # Its signal receivers tell open websockets when a session ends or access changes.
        from dashboard import access  # noqa: F401
