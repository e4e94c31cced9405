"""The dashboard's websocket: one consumer per open screen, pushing re-rendered partials.

Owns: refusing unauthenticated or unauthorised sockets, knowing which screen the browser shows,
catching a reconnecting browser up, and coalescing change notices into at most one push per
COALESCE_SECONDS (overview and workers: per AGGREGATE_SECONDS, their queries are heavier).
Never: queries or renders itself (broadcast.render_swaps does, in a worker thread) or writes.

Access is re-checked while the socket lives (dashboard.access.socket_still_allowed: session and
user read afresh): before the first push after a message from the browser, before a push when the
last check is older than RECHECK_SECONDS, and at once when dashboard.access signals that the
user's session ended or access changed. A socket that lost access is closed (4403) and sends
nothing more.

Renders only what a notice can change: `broadcast.affects` decides in this process, from the
facts the notice carries (kind, queue, state, created of each changed job), whether the screen's
filter can include one of them; a notice that cannot affect the screen costs no query and no
render.

A viewer's sockets cannot slow anyone else's: a socket takes at most MESSAGES_BURST messages at
once and MESSAGES_PER_SECOND after that (a browser sends one per list swap, a human's click) and
is closed (4429) past that; a message that is not `{"screen": {...}}` JSON closes it (4400), one
longer than MAX_MESSAGE unparsed; a handshake whose query string is not UTF-8, is longer than
MAX_HANDSHAKE or holds more than MAX_FIELDS fields, and a screen whose list query Django cannot
read (more fields than DATA_UPLOAD_MAX_NUMBER_FIELDS), are refused (4400) too, with nothing
logged; a user opens at most MAX_SOCKETS_PER_USER in one process (more are refused at the
handshake); and the queries and renders run on a pool of threads (`_db`), never queued behind
one shared thread, and at most USER_THREADS of one user's at once -- one user's slow renders
delay only that user's pushes.

Catch-up: the browser sends the last event id it has seen (`since`). If the database holds newer
events, the consumer re-renders every live region of the screen at once -- partials render
current state, so no event is lost however many were missed.
"""

import asyncio
import contextlib
import functools
import json
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.core.exceptions import SuspiciousOperation
from django.db import connections

from dashboard import access, broadcast, selectors
from dashboard.access import can_view
from dashboard.live import COALESCE_SECONDS, tail

AGGREGATE_SECONDS = 1.0
PAGES = {"overview", "jobs", "job", "rejected", "workers"}
MESSAGES_BURST = 10  # messages a socket may send at once ...
MESSAGES_PER_SECOND = 5.0  # ... and then this many a second
MAX_SOCKETS_PER_USER = 10  # open at once in one process
BAD_MESSAGE, TOO_MANY = 4400, 4429  # close codes (4403: access ended)

# user pk -> that user's open sockets in this process (weak: a consumer that died uncleanly
# frees its place when it is collected).
_OPEN: dict[Any, "weakref.WeakSet[LiveConsumer]"] = {}

# The sockets' queries and renders: on channels' one shared thread (its default) every socket's
# waited behind every other socket's. Each of these threads keeps its own connection.
POOL_THREADS = 4
_POOL = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="dashboard-db")
# One user's sockets run at most this many calls on the pool at once; the rest of that user's
# wait their turn in the event loop. Before, a viewer opening as many slow screens as the pool
# has threads held all of them, and nobody else's socket could even connect.
USER_THREADS = 2  # of POOL_THREADS: a user with a slow tab still gets the other tabs pushed
# (event loop, user pk) -> the turns of that user's sockets; weak: the entry goes with the
# user's last consumer. (A semaphore belongs to the loop it first waited on.)
_TURNS: "weakref.WeakValueDictionary[Any, asyncio.Semaphore]" = weakref.WeakValueDictionary()


def _db(fn: Callable[..., Any]) -> Any:
    return database_sync_to_async(fn, thread_sensitive=False, executor=_POOL)


def _turns_of(user: Any) -> asyncio.Semaphore:
    key = (asyncio.get_running_loop(), getattr(user, "pk", None))
    turns = _TURNS.get(key)
    if turns is None:
        turns = _TURNS[key] = asyncio.Semaphore(USER_THREADS)
    return turns


# The pool calls under way, each holding one of its user's turns until its thread is done.
_CALLS: "set[asyncio.Future[Any]]" = set()


def _call_done(turns: asyncio.Semaphore, call: "asyncio.Future[Any]") -> None:
    _CALLS.discard(call)
    turns.release()
    if not call.cancelled():
        call.exception()  # retrieved: nobody may await a call whose socket went away


def close_connections() -> None:
    """Close the database connection of every pool thread (a shutdown, a test's end): each
    thread takes one of the calls, held at a barrier until all have one."""
    gate = threading.Barrier(POOL_THREADS)

    def close() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            gate.wait(timeout=5)
        connections.close_all()

    for done in [_POOL.submit(close) for _ in range(POOL_THREADS)]:
        done.result(timeout=30)


MAX_VISIBLE = 200  # rows a screen shows (a page is 50); more ids from a browser are ignored
# Characters of the jobs list's query string: the longest the filter form keeps (each field at
# its length, every character a 4-byte one percent-encoded: ~12,800) fits. At 2,000 a long
# search in another script was cut, and the push swapped in the list of a shorter search.
MAX_QUERY = 16_384
# Bytes of the handshake's query string (the screen, its list query encoded once more) and
# characters of a message: a legitimate one is a fraction of either. Longer is refused unread.
MAX_HANDSHAKE = MAX_MESSAGE = 65_536
MAX_FIELDS = 16  # of the handshake's query string: a browser sends six (live.js)


class BadScreen(ValueError):
    """What the browser says it shows cannot be read: the socket is refused (BAD_MESSAGE)."""


def row_id(text: str) -> int | None:
    """A job or event id from the browser: ASCII digits that fit a bigint, else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def screen_from(values: dict[str, Any]) -> broadcast.Screen:
    """What the browser says it shows -- every value bounded: it is the client's word."""

    def one(name: str, default: str = "") -> str:
        value = values.get(name, default)
        text = str(value[0] if isinstance(value, list) and value else value)[:MAX_QUERY]
        # A message is JSON, whose "\\ud800" is a lone surrogate: no text PostgreSQL or a URL
        # can carry (rendering the screen raised). Read as "?", as a browser would send it.
        return text.encode(errors="replace").decode()

    page = one("page")
    ids = (row_id(i) for i in one("ids").split(",")[:MAX_VISIBLE])
    screen = broadcast.Screen(
        page=page if page in PAGES else "overview",
        job=row_id(one("job")),
        query=one("query"),
        first_page=one("first", "1") != "0",
        visible={i for i in ids if i is not None},
    )
    if screen.page == "jobs":
        try:  # read here, once (cached): a render or a notice would raise on it later
            _ = screen.jobs_filters
        except SuspiciousOperation as exc:  # TooManyFieldsSent
            raise BadScreen(f"the list query cannot be read: {exc}") from exc
    return screen


def handshake_query(raw: bytes) -> dict[str, list[str]]:
    """The handshake's query string, parsed; BadScreen if it is over-long, not UTF-8 or holds
    more than MAX_FIELDS fields (counted before any is parsed: 16,000 took 40 ms)."""
    if len(raw) > MAX_HANDSHAKE:
        raise BadScreen(f"a query string of {len(raw):,} bytes")
    try:
        return parse_qs(raw.decode(), max_num_fields=MAX_FIELDS)
    except ValueError as exc:  # UnicodeDecodeError, or too many fields
        raise BadScreen(f"a query string that cannot be read: {exc}") from exc


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the pool, in this user's turn (USER_THREADS at once).

        The turn is given back when the thread is done, not when the caller stops waiting: a
        push cancelled by its socket's disconnect leaves its render running on the pool (a
        thread cannot be interrupted), and giving the turn back then let a user who opened
        and closed slow screens hold every thread of the pool."""
        turns = self.turns
        await turns.acquire()
        call = asyncio.ensure_future(_db(fn)(*args))
        _CALLS.add(call)  # held until done, whoever still waits for it
        call.add_done_callback(functools.partial(_call_done, turns))
        return await asyncio.shield(call)

    async def connect(self) -> None:
        user = self.scope.get("user")
        # Counted before the access check, which waits for the user's turn: handshakes waiting
        # for it are bounded too (an anonymous one is refused without a query).
        sockets = _OPEN.setdefault(getattr(user, "pk", None), weakref.WeakSet())
        if len(sockets) >= MAX_SOCKETS_PER_USER:
            await self.close(code=TOO_MANY)
            return
        sockets.add(self)
        self.turns = _turns_of(user)
        if not (user is not None and user.is_authenticated and await self._run(can_view, user)):
            sockets.discard(self)
            await self.close(code=4403)  # before accept: the handshake is refused (HTTP 403)
            return
        try:
            query = handshake_query(self.scope.get("query_string", b""))
            self.screen = screen_from(query)
        except BadScreen:
            sockets.discard(self)
            await self.close(code=BAD_MESSAGE)  # before accept: refused as the others are
            return
        self.tokens, self.tokens_at = float(MESSAGES_BURST), time.monotonic()
        since = query.get("since", ["0"])[0]
        self.pending = broadcast.Pending()
        self.last_push = 0.0
        self.checked_at = time.monotonic()
        self.closed = False
        self.flushing: asyncio.Task[None] | None = None
        self.groups_joined = [
            broadcast.GROUP,
            access.EVERYONE,
            access.user_group(self.scope["user"].pk),
        ]
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        latest = self.latest = await self._run(selectors.latest_event_id)
        tail.ensure_started(from_id=latest)
        await self.accept()
        seen = row_id(since)
        if seen is None or seen < latest:
            self.pending.everything = True
            await self.push(latest)
        else:
            await self.send_json({"last_event_id": latest, "swaps": []})

    async def disconnect(self, code: int) -> None:
        user = self.scope.get("user")
        sockets = _OPEN.get(getattr(user, "pk", None))
        if sockets is not None:
            sockets.discard(self)
            if not sockets:  # no entry kept per user who ever connected
                _OPEN.pop(getattr(user, "pk", None), None)
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        flushing = getattr(self, "flushing", None)
        if flushing is not None and not flushing.done():
            flushing.cancel()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Bounded before anything else: the rate (no query, no await), then the shape."""
        if self.closed:
            return
        now = time.monotonic()
        self.tokens = min(
            float(MESSAGES_BURST), self.tokens + (now - self.tokens_at) * MESSAGES_PER_SECOND
        )
        self.tokens_at = now
        if self.tokens < 1.0:
            await self.refuse(TOO_MANY, stop=True)
        self.tokens -= 1.0
        if text_data is not None and len(text_data) > MAX_MESSAGE:
            await self.refuse(BAD_MESSAGE, stop=True)  # unparsed: json would hold the loop
        try:
            content = json.loads(text_data) if text_data is not None else None
        except (ValueError, RecursionError):
            content = None
        if not isinstance(content, dict) or not isinstance(content.get("screen"), dict):
            await self.refuse(BAD_MESSAGE, stop=True)
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The browser swapped its list (a filter, another page): follow what it now shows. No
        query here (a message costs microseconds, so a flood reaches its limit at once): access
        is read afresh before the next push, whatever this message asked for."""
        try:
            self.screen = screen_from(content["screen"])
        except BadScreen:
            await self.refuse(BAD_MESSAGE, stop=True)
        self.checked_at = float("-inf")

    async def refuse(self, code: int, stop: bool = False) -> None:
        """Close: nothing more is pushed. With `stop` (a message this socket should never have
        sent) the consumer ends at once, so whatever else the client has queued is dropped
        unread, not handled one by one until the server has dropped the connection."""
        if not self.closed:
            self.closed = True
            self.pending = broadcast.Pending()
            await self.close(code=code)
        if stop:
            await self.disconnect(code)
            raise StopConsumer()

    async def allowed(self, force: bool = False) -> bool:
        """Whether this socket's session and user may still see the dashboard; closes it if
        not. Read from the database when `force`d or after RECHECK_SECONDS, else cached."""
        if self.closed:
            return False
        if force or time.monotonic() - self.checked_at >= access.RECHECK_SECONDS:
            ok = await self._run(access.socket_still_allowed, self.scope)
            self.checked_at = time.monotonic()
            if not ok:
                await self.revoke()
        return not self.closed

    async def revoke(self) -> None:
        await self.refuse(4403)

    async def access_changed(self, message: dict[str, Any]) -> None:
        """dashboard.access says a session ended (named) or the user's access may have changed."""
        if message.get("session") and message["session"] == access.session_key(self.scope):
            await self.revoke()
        else:
            await self.allowed(force=True)

    async def events_changed(self, notice: broadcast.ChangeNotice) -> None:
        if self.closed:
            return
        self.pending.add(notice)
        self.latest = notice["last_event_id"]
        if self.flushing is None or self.flushing.done():
            self.flushing = asyncio.get_running_loop().create_task(self._flush_later())

    async def leases_changed(self, notice: broadcast.LeaseNotice) -> None:
        leases = broadcast.leases_for(self.screen, notice["leases"])
        if leases and await self.allowed():  # none this screen shows: nothing is sent
            await self.send_json({"leases": leases})

    async def _flush_later(self) -> None:
        interval = (
            AGGREGATE_SECONDS if self.screen.page in {"overview", "workers"} else COALESCE_SECONDS
        )
        while self.pending:  # notices arriving while a push renders get the next one
            wait = self.last_push + interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)  # coalescing window: later notices join this push
            await self.push(self.latest)

    async def push(self, last_event_id: int) -> None:
        pending, self.pending = self.pending, broadcast.Pending()
        if broadcast.affects(self.screen, pending) is False:
            return  # nothing this screen shows can have changed: no query, no render, no push
        if not await self.allowed():
            return
        self.last_push = time.monotonic()
        swaps = await self._run(broadcast.render_swaps, self.screen, pending)
        if not self.closed:
            await self.send_json({"last_event_id": last_event_id, "swaps": swaps})
