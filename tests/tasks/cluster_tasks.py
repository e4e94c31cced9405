"""`@task` functions for real-qcluster tests that tests/app/tasks.py has no task for; a cluster
runs them when started with tests.tasks.cluster_settings (which installs tests.tasks).

Importing this module also connects tests/app/tasks.py's PALISADE_TEST_TASK_SIGNALS receivers
(one line `<signal> <id> <status> <attempts>` per signal in that file). In a qcluster started with
PALISADE_TEST_SLOW_FINISHED, one more task_finished receiver, after those, writes a `holding` line
to the same file and then -- `until-exit` -- waits for the process to be ending (its main thread
is over) and writes a `held` line: a notice still being sent when a worker ends normally; or --
`stuck` -- does not return (for a minute): a stuck receiver.
"""

import os
import threading
import time
from typing import Any

from django.tasks import task
from django.tasks.signals import task_finished

from tests.app import tasks as _signal_log  # noqa: F401  (connects the signal-log receivers)

RECEIVER_GIVES_UP_SECONDS = 60.0


@task(timeout=1, max_attempts=1)
def overrun(seconds: float) -> None:
    """Runs `seconds`: past 1 s its one attempt times out and the job fails."""
    time.sleep(seconds)


@task
def quick(n: int) -> int:
    return n


def _write(name: str, task_result: Any) -> None:
    line = f"{name} {task_result.id} {task_result.status} {task_result.attempts}\n"
    with open(os.environ["PALISADE_TEST_TASK_SIGNALS"], "a") as log:
        log.write(line)


def _slow_finished(sender: type, task_result: Any, **kwargs: Any) -> None:
    _write("holding", task_result)
    if os.environ["PALISADE_TEST_SLOW_FINISHED"] == "stuck":
        threading.Event().wait(RECEIVER_GIVES_UP_SECONDS)
        return
    deadline = time.monotonic() + RECEIVER_GIVES_UP_SECONDS
    while threading.main_thread().is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # the poll interval of a deadline-bound wait for the process's end
    _write("held", task_result)


if os.environ.get("PALISADE_TEST_SLOW_FINISHED"):
    task_finished.connect(_slow_finished, weak=False, dispatch_uid="tests.tasks.slow_finished")
