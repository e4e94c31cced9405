"""Refusals before any view: a request whose URL path no view can take.

Owns: `refuse_nul_in_path`, first in settings.MIDDLEWARE. A URL path holding a NUL byte (`%00`)
is a 400 saying so. Why: PostgreSQL's text refuses NUL, and a view that looks a path segment up
as text sent it as it came -- the admin's page of a record whose id is text (a queue control,
django-q2's task records: change, history, delete) and its "view on site" redirect were a 500
(DataError). No legitimate path holds one, so none reaches a view. Sync and async alike (under
ASGI a sync-only middleware would move every request onto a thread).
"""

from collections.abc import Awaitable, Callable
from inspect import iscoroutinefunction
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.utils.decorators import sync_and_async_middleware


def _refused(request: HttpRequest) -> HttpResponse | None:
    if "\x00" in request.path_info:
        return HttpResponseBadRequest(
            "A URL path cannot hold a NUL byte (%00).", content_type="text/plain"
        )
    return None


@sync_and_async_middleware
def refuse_nul_in_path(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    if iscoroutinefunction(get_response):
        answer: Callable[[HttpRequest], Awaitable[HttpResponse]] = get_response

        async def async_middleware(request: HttpRequest) -> HttpResponse:
            return _refused(request) or await answer(request)

        return async_middleware

    def middleware(request: HttpRequest) -> HttpResponse:
        return _refused(request) or get_response(request)

    return middleware
