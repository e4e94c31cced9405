"""The exit guard (jobs.worker.shutdown): a worker process that a handler's non-daemon thread
would hold alive forever leaves without it -- and says so with a non-zero exit status and an
error line, so whatever reads its status sees an exit that abandoned running code.
A real worker-like process (a multiprocessing child, as django-q2's workers are): the guard runs in
its exit, which a test cannot fake in-process."""

import os
import subprocess
import sys
from pathlib import Path

from jobs.worker import shutdown

PROJECT_DIR = Path(__file__).resolve().parents[2]

SCRIPT = """
import logging, multiprocessing, sys, threading
from jobs.worker import shutdown

def worker(name):
    logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(message)s")
    shutdown.EXIT_THREADS_SECONDS = 0.2
    shutdown.install_worker_handler(None)
    if name:
        threading.Thread(target=threading.Event().wait, name=name).start()

child = multiprocessing.get_context("fork").Process(target=worker, args=(sys.argv[1],))
child.start()
child.join(20)
print(child.exitcode)
"""


def _exit_of(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "PALISADE_ENV_FILE": "none"}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_worker_left_held_by_a_handlers_thread_exits_non_zero_and_says_why():
    done = _exit_of("leaked-by-handler")
    assert done.stdout.split() == [str(shutdown.EXIT_LEAKED_THREADS)], done.stderr
    assert shutdown.EXIT_LEAKED_THREADS != 0
    assert f"exits with status {shutdown.EXIT_LEAKED_THREADS}," in done.stderr, done.stderr
    assert "ERROR " in done.stderr and "left running: leaked-by-handler" in done.stderr


def test_a_worker_with_no_thread_left_exits_cleanly():
    done = _exit_of("")
    assert done.stdout.split() == ["0"], done.stderr
    assert "left running" not in done.stderr
