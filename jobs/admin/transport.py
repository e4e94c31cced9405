"""django-q2's admin: transport, read-only.

Its Schedule and queued-task (OrmQ) screens would create work that bypasses the job tables, and
"resubmit" re-sends transport tasks; all of that is removed. What remains is a view of the
transport, for debugging django-q2 itself.
"""

from typing import Any

import django_q.admin as django_q_admin  # registers django-q2's admin first; replaced below
from django.contrib import admin
from django.http import HttpRequest


def _read_only(base: type[admin.ModelAdmin]) -> type[admin.ModelAdmin]:
    class ReadOnlyTransport(base):  # type: ignore[valid-type,misc]
        actions: list[Any] = []

        def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
            return False

        def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
            return False

        def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
            return False

    ReadOnlyTransport.__name__ = f"ReadOnly{base.__name__}"
    return ReadOnlyTransport


for _model, _admin in list(admin.site._registry.items()):
    if _model._meta.app_label == "django_q":
        admin.site.unregister(_model)
        admin.site.register(_model, _read_only(type(_admin)))

assert django_q_admin  # imported for its registrations, replaced above
