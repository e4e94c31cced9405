"""The operations dashboard: screens only. Job kinds, the seed and the drill live in demo/."""

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Operations dashboard"
