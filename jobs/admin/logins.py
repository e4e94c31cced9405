"""django-axes' screen of login attempts, with its "Clean up expired attempts" action working.

Hazard: axes 8.3's action reads `request.axes_attempt_time`, which axes sets only on a login
request; pressed from the admin it was always a 500 (AttributeError). The screen is axes' own,
registered again with the action given the request attributes axes' handler reads (the attempt
time: now), so the action deletes the attempts whose cool-off has passed, as it says. Only where
axes registers its screens (AXES_ENABLE_ADMIN, its default).
"""

from typing import Any

import axes.admin as axes_admin  # registers axes' screens first; the attempts' is replaced below
from axes.handlers.proxy import AxesProxyHandler
from axes.models import AccessAttempt
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs.admin.common import CheckedLookups

_AXES_ACTION = axes_admin.AccessAttemptAdmin.cleanup_expired_attempts


class LoginAttemptAdmin(CheckedLookups, axes_admin.AccessAttemptAdmin):
    @admin.action(description=_AXES_ACTION.short_description)  # type: ignore[attr-defined]
    def cleanup_expired_attempts(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        AxesProxyHandler.update_request(request)  # what a login request carries; the time: now
        _AXES_ACTION(self, request, queryset)


if admin.site.is_registered(AccessAttempt):
    admin.site.unregister(AccessAttempt)
    admin.site.register(AccessAttempt, LoginAttemptAdmin)
