"""Real `manage.py qcluster` processes for acceptance tests, and deadline-bound waits.

Owns: starting qcluster subprocesses against the pytest-django *test* database with short leases,
signalling the django-q2 worker process that runs an attempt (SIGSTOP/SIGCONT/SIGKILL), and
stopping every process it started (SIGCONT, SIGTERM, a deadline, then SIGKILL of the whole process
group), so no test leaves a process behind.

Never: sleeps as synchronisation. `wait_until` polls the database until a condition holds or a
deadline passes; the only other sleeps are the pauses of a shutdown waiting for processes to exit.

Hazards: a subprocess must use the *test* database (settings_dict NAME is `test_...`), not the
DATABASE_URL of the pytest process, or it would run jobs that no test can see. On the SQLite tier
that is the test database's file (PALISADE_SQLITE_PATH). A signal goes only
to a pid inside a process group this module started.
"""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from django.db import connection

from jobs.models import Attempt, Job, RejectedWrite
from tests.conftest import database_now

PROJECT_DIR = Path(__file__).resolve().parents[2]
POLL_SECONDS = 0.05  # how often wait_until re-reads the database
STOP_GRACE_SECONDS = 5.0  # SIGTERM -> SIGKILL
GONE_SECONDS = 10.0  # after SIGKILL, how long the process group may take to disappear

LEASE_SECONDS = 2.0
HEARTBEAT_SECONDS = 0.5
# Short leases so a reclaim takes about two seconds. Heartbeat <= lease / 3 (system check
# jobs.E003); one job per claim, so a drain never holds a job it has not started; two django-q2
# workers, so a second process is free while the first one is stopped.
FAST_JOBS_ENV = {
    "JOBS_LEASE_SECONDS": str(LEASE_SECONDS),
    "JOBS_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
    "JOBS_REAPER_SECONDS": "0.2",
    "JOBS_POLL_SECONDS": "0.2",
    "JOBS_CLAIM_BATCH": "1",
    "JOBS_WORKERS": "2",
}


def subprocess_database_url(via_port: int | None = None) -> str:
    """DATABASE_URL of the database this test runs against (pytest-django's test_...).

    `via_port`: reach it through a local proxy listening on that port instead.
    """
    s = connection.settings_dict
    user = quote(s.get("USER") or "", safe="")
    password = quote(s.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = s.get("HOST") or "127.0.0.1"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    if via_port is not None:
        host, port = "127.0.0.1", f":{via_port}"
    return f"postgres://{auth}{host}{port}/{quote(s['NAME'], safe='')}"


def subprocess_database_env() -> dict[str, str]:
    """The environment that points a subprocess at this test's database, on either tier."""
    if connection.vendor == "sqlite":
        return {
            "DJANGO_SETTINGS_MODULE": "tests.settings_sqlite",
            "DATABASE_URL": "",
            "PALISADE_SQLITE_PATH": str(connection.settings_dict["NAME"]),
        }
    return {"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": subprocess_database_url()}


# -- waiting on the database ---------------------------------------------------------------


def describe(job_id: int) -> dict[str, Any]:
    """The job, its attempts and its rejected writes, for failure messages."""
    return {
        "job": Job.objects.filter(pk=job_id)
        .values("state", "attempt", "lease_expires_at", "result", "error")
        .first(),
        "attempts": list(
            Attempt.objects.filter(job_id=job_id).values_list("number", "worker", "outcome")
        ),
        "rejected": list(
            RejectedWrite.objects.filter(job_id=job_id).values_list(
                "write", "attempt_presented", "attempt_current", "state_current", "worker"
            )
        ),
    }


def wait_until[T](
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    job_id: int,
    poll: float = POLL_SECONDS,
) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}: {describe(job_id)}"
            )
        time.sleep(poll)  # the poll interval of a deadline-bound wait


def wait_for_attempt(
    job_id: int, number: int, timeout: float = 20.0, poll: float = POLL_SECONDS
) -> Attempt:
    """The Attempt row of claim `number` (its worker names the process running it)."""
    return wait_until(
        lambda: Attempt.objects.filter(job_id=job_id, number=number).first(),
        timeout=timeout,
        what=f"attempt {number} to be claimed",
        job_id=job_id,
        poll=poll,
    )


def wait_for_outcome(
    job_id: int, number: int, outcomes: set[str], timeout: float = 20.0
) -> Attempt:
    return wait_until(
        lambda: Attempt.objects.filter(job_id=job_id, number=number, outcome__in=outcomes).first(),
        timeout=timeout,
        what=f"attempt {number} to end as one of {sorted(outcomes)}",
        job_id=job_id,
    )


def wait_for_state(job_id: int, state: str, timeout: float = 20.0) -> Job:
    return wait_until(
        lambda: Job.objects.filter(pk=job_id, state=state).first(),
        timeout=timeout,
        what=f"the job to be {state}",
        job_id=job_id,
    )


def wait_for_rejection(
    job_id: int, attempt: int, writes: set[str], timeout: float = 20.0
) -> RejectedWrite:
    return wait_until(
        lambda: RejectedWrite.objects.filter(
            job_id=job_id, attempt_presented=attempt, write__in=writes
        ).first(),
        timeout=timeout,
        what=f"a rejected {'/'.join(sorted(writes))} of attempt {attempt}",
        job_id=job_id,
    )


def wait_for_db_clock_past(job_id: int, moment: datetime, seconds: float) -> None:
    """Wait until the database clock is `seconds` past `moment` (a DB timestamp)."""

    def past() -> bool:
        return database_now() > moment + timedelta(seconds=seconds)

    wait_until(past, timeout=seconds + 10, what=f"{seconds}s to pass since {moment}", job_id=job_id)


def worker_pid(worker: str) -> int:
    """The pid in an Attempt.worker value "<hostname>:<pid>"."""
    return int(worker.rsplit(":", 1)[1])


# -- the processes -------------------------------------------------------------------------


@dataclass
class QCluster:
    """One `manage.py qcluster` process group: scheduler, sentinel, django-q2 workers."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session=True: the command leads its own group

    def _signal(self, pid: int, sig: signal.Signals) -> None:
        try:
            in_group = os.getpgid(pid) == self.pgid
        except ProcessLookupError:
            in_group = False
        assert in_group, f"pid {pid} is not a live process of qcluster group {self.pgid}"
        os.kill(pid, sig)

    def pause(self, pid: int) -> None:
        self._signal(pid, signal.SIGSTOP)

    def resume(self, pid: int) -> None:
        self._signal(pid, signal.SIGCONT)

    def kill(self, pid: int) -> None:
        self._signal(pid, signal.SIGKILL)

    @staticmethod
    def sleeping(pid: int) -> bool:
        """True while the process's main thread (the one running handlers) is in time.sleep()."""
        try:
            return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
        except FileNotFoundError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _gone(self) -> bool:
        if self.proc.poll() is None:
            return False
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return True
        return False

    def _wait_gone(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self._gone():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)  # waiting for processes to exit during shutdown
        return True

    def shutdown(self) -> None:
        """SIGCONT the group, SIGTERM the command, wait with a deadline, SIGKILL the group.

        SIGTERM goes to the command alone: django-q2 then stops its sentinel and workers in
        order. (A SIGTERM to every process of the group at once kills the sentinel under the
        command, which then hangs in multiprocessing's Event.set(); the deadline covers that.)
        """
        for target, sig in ((-self.pgid, signal.SIGCONT), (self.pgid, signal.SIGTERM)):
            try:
                os.kill(target, sig)
            except ProcessLookupError:
                pass
        try:
            if not self._wait_gone(STOP_GRACE_SECONDS):
                try:
                    os.killpg(self.pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                if not self._wait_gone(GONE_SECONDS):
                    raise RuntimeError(f"qcluster process group {self.pgid} survived SIGKILL")
        finally:
            self.log_file.close()


@contextmanager
def running_clusters(log_dir: Path) -> Iterator[tuple[Callable[..., QCluster], list[QCluster]]]:
    """Yield (`start(**env)`, started); every cluster started is shut down on exit."""
    started: list[QCluster] = []

    def start(**env_overrides: str) -> QCluster:
        env = {
            **os.environ,
            **subprocess_database_env(),
            "PYTHONUNBUFFERED": "1",
            "JOBS_LOG_LEVEL": "INFO",
            "Q_LOG_LEVEL": "INFO",
            **FAST_JOBS_ENV,
            **env_overrides,
        }
        log_path = log_dir / f"qcluster-{len(started)}.log"
        log_file = open(log_path, "wb")  # noqa: SIM115  (closed by shutdown)
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=PROJECT_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        cluster = QCluster(proc, log_path, log_file)
        started.append(cluster)
        return cluster

    try:
        yield start, started
    finally:
        errors: list[Exception] = []
        for cluster in started:
            try:
                cluster.shutdown()
            except Exception as exc:  # noqa: BLE001  (shut every cluster down, then report)
                errors.append(exc)
        if errors:
            raise errors[0]


# -- the zombie set-up both test modules share -------------------------------------------


@dataclass(frozen=True)
class Reclaimed:
    """A job whose first attempt's worker is stopped while a second attempt took over."""

    job_id: int
    zombie: int  # pid of the stopped worker process, still inside attempt 1's handler
    paused_at: datetime  # database clock, just after the SIGSTOP
    first: Attempt
    second: Attempt


def pause_first_attempt_until_reclaimed(
    cluster: QCluster, job_id: int, *, before_first_beat: bool = True
) -> Reclaimed:
    """SIGSTOP the worker inside attempt 1's `test.sleep`; wait for the reaper and attempt 2.

    The worker is stopped while its handler sleeps (its main thread is in nanosleep), so once
    resumed after the sleep ran out the handler returns at once. It is also stopped before the
    drain's first background heartbeat (HEARTBEAT_SECONDS after the drain began), and both are
    asserted: the heartbeat thread has then not opened its database connection yet, so the
    runner's commit, presented on the connection that made the claim, is the zombie's first stale
    write and is recorded while the heartbeat thread is still connecting. Stopped earlier (before
    the sleep began) or later (after a heartbeat), the resumed zombie's heartbeat could find the
    lease gone first and the commit would never be presented. That order is still a race with the
    heartbeat thread's connecting on a loaded machine: a test that must see a stale write reach
    the database resumes the zombie inside `heartbeats_held_back` instead, and passes
    `before_first_beat=False` (it then need not be stopped before the first heartbeat).
    """
    first = wait_for_attempt(job_id, 1, poll=0.01)
    zombie = worker_pid(first.worker)
    wait_until(
        lambda: cluster.sleeping(zombie),
        timeout=5,
        what=f"worker {zombie} to be inside the handler's sleep",
        job_id=job_id,
        poll=0.002,
    )
    cluster.pause(zombie)
    paused_at = database_now()
    first.refresh_from_db()
    assert Job.objects.filter(pk=job_id, state="running", attempt=1).exists(), (
        f"attempt 1 ended before its worker was stopped: {describe(job_id)}"
    )
    assert not before_first_beat or (
        first.heartbeat_at - first.claimed_at < timedelta(seconds=HEARTBEAT_SECONDS / 2)
    ), "the worker was stopped only after its first heartbeat; see this function's docstring"
    wait_for_outcome(job_id, 1, {"expired"})
    second = wait_for_attempt(job_id, 2)
    assert worker_pid(second.worker) != zombie, "the stopped process cannot have claimed again"
    return Reclaimed(job_id, zombie, paused_at, first, second)


@contextmanager
def heartbeats_held_back(conn: Any) -> Iterator[None]:
    """While inside, no heartbeat of any worker can run: `conn` (a second connection,
    PostgreSQL) holds `jobs_job` in SHARE mode, which every UPDATE of the table waits for -- a
    stale heartbeat too, although its row no longer matches (a row lock would not stop it: an
    UPDATE locks only the rows its WHERE still finds). A stale write takes nothing that
    conflicts: the fenced statements only read the job row (ACCESS SHARE) and recording a
    refusal checks its foreign key (ROW SHARE, FOR KEY SHARE). So a zombie resumed inside
    presents its next write to the database before its heartbeat can find the lease gone and
    stop it, whichever of its threads the kernel runs first. Every other write of `jobs_job`
    (claims, commits, the reaper) waits too: keep the block short."""
    with conn.transaction():
        conn.execute("LOCK TABLE jobs_job IN SHARE MODE")
        yield
