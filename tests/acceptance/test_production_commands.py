"""The production commands of docs/operations.md ("Running it in production"), run as a new user
would: from a shell where `.venv` is not activated (its bin/ is not on PATH), against the test
database -- migrate, collectstatic, a `qcluster` that runs a job, and uvicorn serving the
dashboard (and htmx from django-htmx)."""

import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.template import Context, Template

from jobs import enqueue
from tests.acceptance.cluster import PROJECT_DIR, subprocess_database_env, wait_for_state

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def production_commands() -> list[str]:
    operations = (PROJECT_DIR / "docs" / "operations.md").read_text()
    section = operations.split("## Running it in production", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "no command block under 'Running it in production'"
    lines = [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith(("export ", "bin/setup"))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310  (our local server)
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_every_production_command_names_the_venvs_programs():
    commands = production_commands()
    assert len(commands) == 4, commands
    for command in commands:
        assert command.startswith(".venv/bin/"), f"needs an activated venv: {command}"


def test_the_production_commands_work_without_an_activated_venv(tmp_path: Path):
    env = {
        **{k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}},
        **subprocess_database_env(),
        "PATH": "/usr/bin:/bin",  # no .venv/bin: the commands must not rely on it
        "SECRET_KEY": "production-commands-test-" + "x" * 30,
        "DJANGO_DEBUG": "0",
        "PALISADE_ENV_FILE": "none",  # production has no .env (never the checkout's dev one)
        "STATIC_ROOT": str(tmp_path / "static"),
        "JOBS_LOG_LEVEL": "INFO",
    }
    port = free_port()
    migrate, collectstatic, qcluster, web = production_commands()
    assert "--host 0.0.0.0 --port 8000" in web, web
    web = web.replace("--host 0.0.0.0 --port 8000", f"--host 127.0.0.1 --port {port}")
    for command in (migrate, collectstatic):
        done = subprocess.run(
            shlex.split(command), cwd=PROJECT_DIR, env=env, capture_output=True, timeout=120
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    assert list((tmp_path / "static" / "django_htmx").glob("htmx*.js"))

    procs = [
        subprocess.Popen(
            shlex.split(command),
            cwd=PROJECT_DIR,
            env=env,
            stdout=(tmp_path / f"{name}.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for name, command in (("qcluster", qcluster), ("web", web))
    ]
    try:
        job = enqueue("test.echo", {"from": "docs/operations.md"})
        wait_for_state(job.pk, "succeeded", timeout=60)
        deadline = time.monotonic() + 30
        status = 0
        while time.monotonic() < deadline:
            try:
                status, page = get(f"http://127.0.0.1:{port}/login/")
                break
            except OSError:  # not listening yet
                time.sleep(0.1)  # the poll interval of a deadline-bound wait
        assert status == 200, (tmp_path / "web.log").read_text()
        assert "csrfmiddlewaretoken" in page
        # htmx as the dashboard's pages load it ({% htmx_script %}): django-htmx's own copy.
        tag = Template("{% load django_htmx %}{% htmx_script %}").render(Context())
        src = re.search(r'src="([^"]+)"', tag)
        assert src and src.group(1).startswith("/static/django_htmx/htmx"), tag
        status, script = get(f"http://127.0.0.1:{port}{src.group(1)}")
        assert status == 200 and "htmx" in script[:5000]
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
