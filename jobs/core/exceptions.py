"""One exception root for the job platform; names say what happened."""


class JobsError(Exception):
    """Root of every error the job platform raises on purpose."""


class LeaseLost(JobsError):
    """A fenced write changed zero rows: this attempt no longer owns the job.

    The worker that gets it discards its work and never retries the write.
    """

    def __init__(self, job_id: int, attempt: int, write: str) -> None:
        super().__init__(f"job {job_id} attempt {attempt}: {write} rejected, lease lost")
        self.job_id = job_id
        self.attempt = attempt
        self.write = write

    def __reduce__(self) -> tuple[type["LeaseLost"], tuple[int, int, str]]:
        # Exception pickles as cls(*self.args) -- the message alone, which this __init__ does
        # not take: a LeaseLost raised in a child process (a handler's process pool) came back
        # as a TypeError instead.
        return type(self), (self.job_id, self.attempt, self.write)


class AttemptEnded(LeaseLost):
    """Something was recorded (an intent, a staged output) for an attempt whose final write is
    already decided -- by a thread the handler left running: refused, nothing recorded."""

    def __init__(self, job_id: int, attempt: int, write: str) -> None:
        super().__init__(job_id, attempt, write)
        self.args = (
            f"job {job_id} attempt {attempt}: {write} after its attempt ended (its final write "
            "is decided): nothing recorded",
        )


class PermanentFailure(JobsError):
    """A handler's failure no retry can mend (jobs.tasks.UnencodableResult: a task's return
    value that cannot be stored): the runner fails the job at once, whatever attempts remain."""


class EnqueueError(JobsError, ValueError):
    """Enqueue refused its input; nothing was written."""


class UnknownKind(EnqueueError):
    """No handler is registered under this kind."""


class InvalidPayload(EnqueueError):
    """The payload (or a result, or progress) is not JSON the database can store."""


class PayloadTooLarge(InvalidPayload):
    """The payload's JSON encoding exceeds JOBS['MAX_PAYLOAD_BYTES']."""


class InvalidQueue(EnqueueError):
    """The queue name is not a short slug."""


class InvalidOption(EnqueueError):
    """priority, run_at, max_attempts, lease_seconds, unique_key or a handler option is out of
    range (see jobs.core.bounds)."""


class DuplicateJob(EnqueueError):
    """unique_key is held by a live job this transaction cannot see (REPEATABLE READ snapshot).

    A visible holder is returned instead (`job.duplicate = True`); this is raised only when the
    caller's snapshot hides it, so retrying in a new transaction returns it.
    """


class HandlerAlreadyRegistered(JobsError):
    """Two handlers claimed the same kind."""
