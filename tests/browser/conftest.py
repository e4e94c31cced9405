"""Real-browser fixtures: Debian's Chromium driven by Playwright, against the production ASGI server
(uvicorn) and, where a test needs workers, real qcluster processes -- all on the pytest test
database.

Never downloads a browser (`playwright install` is never run): Chromium comes from Debian
(`bin/test` installs it when missing); if it truly cannot be found the tests skip, saying why.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection, connections
from django.test import Client

from tests.acceptance.cluster import (
    PROJECT_DIR,
    QCluster,
    running_clusters,
    subprocess_database_url,
)

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS", PROJECT_DIR / "var" / "test-artifacts"))
SERVER_START_SECONDS = 20.0

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def orm_beside_playwright(monkeypatch: pytest.MonkeyPatch) -> None:
    """Playwright's sync API keeps an event loop running in this thread; the tests' own ORM
    calls (planting users and jobs) are still plain synchronous code, so allow them."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def chromium_path() -> str | None:
    for candidate in (
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    """Per test, not per session: while Playwright's sync API is active it keeps an event loop
    running in this thread, and every later test's ORM call would be refused as "async"."""
    executable = chromium_path()
    if executable is None:
        pytest.skip(
            "Debian's chromium is not installed (bin/test runs `apt-get install -y chromium`)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
        # The ORM calls made while Playwright's loop ran used a connection of that context
        # (asgiref's Local); close it here, while that context is still current.
        connections.close_all()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the web server exited: {log.read_text(errors='replace')}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)  # poll interval of a deadline-bound wait for the server to listen
    raise RuntimeError(f"the server did not listen on {port}: {log.read_text(errors='replace')}")


@pytest.fixture
def server(transactional_db: None, tmp_path: Path) -> Iterator[str]:
    """The production web server (uvicorn with config.websocket's protocol, as docs/operations.md
    runs it) serving config.asgi on the test database; yields its base URL."""
    port = _free_port()
    log = tmp_path / "web.log"
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"},
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": subprocess_database_url(),
        "DJANGO_DEBUG": "1",  # static files through the finders, no collectstatic needed
        "PYTHONUNBUFFERED": "1",
        "JOBS_LOG_LEVEL": "INFO",
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--lifespan",
                "off",
                "--ws",
                "config.websocket:BoundedWebSocketProtocol",
                "config.asgi:application",
            ],
            cwd=PROJECT_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _wait_for_port(port, proc, log)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            _wait_for_other_sessions_to_end()


def _wait_for_other_sessions_to_end(seconds: float = 5.0) -> None:
    """A server backend outlives its client by a moment; pytest-django then could not drop the
    test database at the end of the session. Wait (with a deadline) until they are gone."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cur.fetchone()[0] == 0:
                return
        time.sleep(0.05)  # poll interval of a deadline-bound wait


@pytest.fixture
def qcluster(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., QCluster]]:
    """`qcluster(**env)` starts a real qcluster with two-second leases; stopped at teardown."""
    with running_clusters(tmp_path) as (start, _started):
        yield start


def make_user(name: str, *, staff: bool = False) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=staff)
    if staff:
        user.user_permissions.add(*Permission.objects.filter(content_type__app_label="dashboard"))
    else:
        group, _ = Group.objects.get_or_create(name="operators")
        group.permissions.add(Permission.objects.get(codename="view_dashboard"))
        user.groups.add(group)
    return user


@pytest.fixture
def page_as(browser: Any, server: str) -> Iterator[Callable[[User], Any]]:
    """`page_as(user)` -> a Playwright page logged in as `user` (session cookie, no form)."""
    contexts: list[Any] = []

    def open_page(user: User) -> Any:
        client = Client()
        client.force_login(user)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        contexts.append(context)
        cookie = client.cookies["sessionid"].value
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": server}])
        page = context.new_page()
        page.set_default_timeout(20_000)
        return page

    yield open_page
    for context in contexts:
        context.close()
