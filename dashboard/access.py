"""Who may see and who may press, for pages and for sockets -- and for how long.

Seeing needs a logged-in, active user with `dashboard.view_dashboard` (the read-only "operators"
group); pressing needs `is_staff` too, the press's own permission (`dashboard.run_drill` for the
drill, `jobs.change_job` for job actions and queue controls, `jobs.change_schedule` for cron) and
a POST with CSRF.

A websocket is checked for longer than a request: `socket_still_allowed` re-reads its session and
user from the database (the consumer calls it on every receive and, at most every
RECHECK_SECONDS, before a push), and the signal receivers below tell open sockets at once when a
session ends (logout) or a user's access may have changed (deactivation, deletion, groups,
permissions), so the consumer re-checks and closes. `SameOriginValidator` refuses a websocket
handshake whose Origin is not this site's scheme, host and port (or a CSRF_TRUSTED_ORIGINS entry).
"""

import asyncio
import logging
from collections.abc import Callable
from functools import wraps
from importlib import import_module
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group, User
from django.contrib.auth.signals import user_logged_out
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain
from django.views.decorators.http import require_POST

from dashboard.models import DRILL_PERMISSION, VIEW_PERMISSION

logger = logging.getLogger("dashboard.access")

View = Callable[..., HttpResponse]
EVERYONE = "dashboard.access"  # every open socket: a group's permissions changed
RECHECK_SECONDS = 2.0  # a socket's access is re-read at least this often while it pushes


def user_group(user_id: Any) -> str:
    """The channel-layer group of one user's open sockets."""
    return f"dashboard.user.{int(user_id)}"


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


# -- sockets: re-checked while open ------------------------------------------------------------


def session_key(scope: dict[str, Any]) -> str | None:
    session = scope.get("session")
    return getattr(session, "session_key", None) if session is not None else None


def socket_still_allowed(scope: dict[str, Any]) -> bool:
    """Whether the socket's user may still see the dashboard, read afresh from the database
    (sync). A browser's socket also needs its session to still log that user in: a logout, an
    expired session or a changed password ends it. Never the scope's cached user or permissions."""
    user = scope.get("user")
    if user is None or not user.is_authenticated:
        return False
    key = session_key(scope)
    fresh: Any
    if key:
        store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key)
        fresh = auth.get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]
        if fresh.pk != user.pk:
            return False
    else:  # a socket without a session (tests, an embedding): the user alone decides
        fresh = User.objects.filter(pk=user.pk).first()
    return can_view(fresh)


def _tell(group: str, message: dict[str, Any]) -> None:
    """Send to open sockets; never lets a failure of the channel layer break the caller."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    try:
        if loop is None:  # a sync view, the admin, a shell: the usual case
            async_to_sync(layer.group_send)(group, message)
        else:  # sync code inside an event loop's own thread: no blocking send from here
            task = loop.create_task(layer.group_send(group, message))
            _SENDING.add(task)
            task.add_done_callback(_SENDING.discard)
    except Exception as error:  # noqa: BLE001  (the sockets' periodic re-check is the backstop)
        logger.warning("could not tell open sockets that access changed: %r", error)


_SENDING: set[asyncio.Task[None]] = set()  # sends scheduled on a running loop, kept referenced


def _recheck(group: str) -> None:
    transaction.on_commit(lambda: _tell(group, {"type": "access.changed", "session": ""}))


@receiver(user_logged_out, dispatch_uid="dashboard.access.logout")
def _logged_out(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    key = request.session.session_key if request is not None else None
    if user is not None and key:  # sent before the session is flushed: name it, close its sockets
        _tell(user_group(user.pk), {"type": "access.changed", "session": key})


@receiver(post_save, sender=User, dispatch_uid="dashboard.access.user_saved")
@receiver(post_delete, sender=User, dispatch_uid="dashboard.access.user_deleted")
def _user_changed(sender: Any, instance: User, **kwargs: Any) -> None:
    if kwargs.get("created") or kwargs.get("update_fields") == frozenset({"last_login"}):
        return  # a new user has no socket; a login changes nobody's access
    _recheck(user_group(instance.pk))


@receiver(m2m_changed, sender=User.groups.through, dispatch_uid="dashboard.access.groups")
@receiver(m2m_changed, sender=User.user_permissions.through, dispatch_uid="dashboard.access.perms")
def _membership_changed(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: set[int] | None, **kw: Any
) -> None:
    if not action.startswith("post_"):
        return
    if isinstance(instance, User):
        _recheck(user_group(instance.pk))
    elif pk_set is None:  # a group or permission cleared of every user
        _recheck(EVERYONE)
    else:
        for pk in pk_set:
            _recheck(user_group(pk))


@receiver(m2m_changed, sender=Group.permissions.through, dispatch_uid="dashboard.access.group")
@receiver(post_delete, sender=Group, dispatch_uid="dashboard.access.group_deleted")
def _group_changed(sender: Any, action: str = "post_", **kwargs: Any) -> None:
    if action.startswith("post_"):
        _recheck(EVERYONE)


# -- sockets: the handshake's Origin -----------------------------------------------------------


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin1"))
    return None


def _secure(scope: dict[str, Any]) -> bool:
    if scope.get("scheme") in {"wss", "https"}:
        return True
    proxy = settings.SECURE_PROXY_SSL_HEADER
    if proxy:  # as Django's HttpRequest.is_secure(): the proxy's word, only if configured
        name = proxy[0].removeprefix("HTTP_").replace("_", "-").lower().encode()
        value = _header(scope, name)
        return value is not None and value.split(",")[0].strip() == proxy[1]
    return False


def _origin(url: str) -> str | None:
    """scheme://host[:port], lower-cased, the default port dropped; None if it is not one."""
    try:
        parts = urlsplit(url.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        return None
    host = parts.netloc.rsplit("@", 1)[-1]
    if port is not None and port == {"http": 80, "https": 443}[parts.scheme]:
        host = host.rsplit(":", 1)[0]
    return f"{parts.scheme}://{host}"


def origin_allowed(scope: dict[str, Any]) -> bool:
    """The Origin must be this site as the browser reached it -- scheme, host *and* port, like
    Django's CSRF check -- or a CSRF_TRUSTED_ORIGINS entry; the Host must be an ALLOWED_HOST."""
    origin, host = _header(scope, b"origin"), _header(scope, b"host")
    if not origin or not host:
        return False
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    seen = _origin(origin)
    if seen is None:
        return False
    ours = _origin(f"{'https' if _secure(scope) else 'http'}://{host}")
    return seen == ours or _trusted(seen)


def _trusted(seen: str) -> bool:
    """A CSRF_TRUSTED_ORIGINS entry, read as Django's CSRF check reads it: `https://*.example.com`
    trusts example.com and every subdomain of it on that scheme (and port, if it names one)."""
    scheme, _, netloc = seen.partition("://")
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        if "*" in entry:
            parts = urlsplit(entry.strip().lower())
            if parts.scheme == scheme and is_same_domain(netloc, parts.netloc.lstrip("*")):
                return True
        elif _origin(entry) == seen:
            return True
    return False


class SameOriginValidator:
    """ASGI middleware: a websocket handshake from another origin is refused (HTTP 403)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
