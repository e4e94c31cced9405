"""Who may see and who may press: one decorator per kind of access, used by views and consumers.

Seeing needs a logged-in user with `dashboard.view_dashboard` (the read-only "operators" group);
pressing an action also needs `is_staff` and `dashboard.run_drill`, and a POST with CSRF.
"""

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_POST

from dashboard.models import DRILL_PERMISSION, VIEW_PERMISSION

View = Callable[..., HttpResponse]


def can_view(user: Any) -> bool:
    return bool(
        user and user.is_authenticated and user.is_active and user.has_perm(VIEW_PERMISSION)
    )


def can_act(user: Any) -> bool:
    return can_view(user) and bool(user.is_staff) and user.has_perm(DRILL_PERMISSION)


def viewer(view: View) -> View:
    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not can_view(request.user):
            raise PermissionDenied("the dashboard needs the view_dashboard permission")
        return view(request, *args, **kwargs)

    return wrapped


def actor(view: View) -> View:
    @require_POST
    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not can_act(request.user):
            raise PermissionDenied("actions need staff status and the run_drill permission")
        return view(request, *args, **kwargs)

    return wrapped
