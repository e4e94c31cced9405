"""The dashboard's permissions; the dashboard stores nothing of its own.

`Access` is an unmanaged model with no table: it exists so that Django creates the two
permissions below. Seeing any screen or opening the websocket needs `view_dashboard` (the
"operators" group has it and nothing else); pressing an action also needs `is_staff` and
`run_drill`. Superusers have every permission.
"""

from django.db import models

VIEW_PERMISSION = "dashboard.view_dashboard"
DRILL_PERMISSION = "dashboard.run_drill"
OPERATORS_GROUP = "operators"


class Access(models.Model):
    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_dashboard", "Can see the operations dashboard (read-only)"),
            ("run_drill", "Can run the zombie drill from the dashboard"),
        ]

    def __str__(self) -> str:
        return "dashboard access"
