"""django-q2's admin: transport, read-only -- and the outbox's transport: retrying failed intents.

Its Schedule and queued-task (OrmQ) screens would create work that bypasses the job tables, and
"resubmit" re-sends transport tasks; all of that is removed. What remains is a view of the
transport, for debugging django-q2 itself.

The intents' screen (jobs/admin/records.py) offers two actions defined here, both through
jobs.ops.intents.retry (permission-checked, audited in LogEntry, an `intent_retried` event):
retry the selected failed intents (reconciled first where an earlier call's outcome is unknown),
or perform them again (the operator accepts a possible duplicate).
"""

from typing import Any

import django_q.admin as django_q_admin  # registers django-q2's admin first; replaced below
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs.admin.common import CheckedLookups
from jobs.ops import intents


def _read_only(base: type[admin.ModelAdmin]) -> type[admin.ModelAdmin]:
    class ReadOnlyTransport(CheckedLookups, base):  # type: ignore[valid-type,misc]
        actions: list[Any] = []

        def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
            return False

        def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
            return False

        def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
            return False

    ReadOnlyTransport.__name__ = f"ReadOnly{base.__name__}"
    return ReadOnlyTransport


def _retry(request: HttpRequest, queryset: QuerySet[Any], perform_again: bool) -> None:
    ids = list(queryset.order_by("id").values_list("id", flat=True)[: intents.MAX_ROWS])
    try:
        report = intents.retry(ids, user=request.user, via="admin", perform_again=perform_again)
    except PermissionError as exc:
        messages.error(request, str(exc))
        return
    messages.info(request, report.summary())


@admin.action(description="Retry the selected failed intents (reconcile first if unknown)")
def retry_failed_intents(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> None:
    _retry(request, queryset, perform_again=False)


@admin.action(description="Perform the selected failed intents again (a duplicate is possible)")
def perform_failed_intents_again(
    modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]
) -> None:
    _retry(request, queryset, perform_again=True)


INTENT_ACTIONS = [retry_failed_intents, perform_failed_intents_again]


for _model, _admin in list(admin.site._registry.items()):
    if _model._meta.app_label == "django_q":
        admin.site.unregister(_model)
        admin.site.register(_model, _read_only(type(_admin)))

assert django_q_admin  # imported for its registrations, replaced above
