"""What a drain gives back, on its background thread: batch-mates waiting behind a slow handler,
the jobs not started when a stop is requested, and everything it holds when a stop's grace
period is over (jobs.worker.runner passes these to its Heartbeater).

Never: decides an outcome -- every hand-back is a fenced release (queued again, the attempt
uncharged), and a job whose hand-back the database did not answer stays held, beaten, and is
tried again or run.
"""

import logging
import os
import sys

from jobs.context import Held
from jobs.core import registry
from jobs.worker import completer
from jobs.worker.heartbeat import Heartbeater

logger = logging.getLogger("jobs.runner")

# After the grace period's hand-back, how long an abandoned handler may still run (its writes
# are rejected and recorded meanwhile) before its worker process ends.
ABANDON_SECONDS = 0.25


def waiting(waiting: list[Held]) -> list[Held]:
    """On the drain's background thread: jobs of this batch that waited behind a handler running
    longer than HANDOFF_SECONDS go back to the queue (fenced, uncharged), so that a free worker
    -- woken by the requeue's NOTIFY -- takes them now rather than after the slow one. The
    runner's `beats.start` then refuses them. Returns those whose hand-back was decided; the
    others (the database did not answer) stay held, beaten, and are tried again."""
    return [
        h
        for h in waiting
        if completer.hand_back(h.fence, "(waited behind a slow batch-mate)", logging.INFO)
    ]


def unstarted(beats: Heartbeater) -> None:
    """On the drain's background thread, as soon as a stop is requested: jobs claimed but not
    started go back at once, not after the running handler or the grace period."""
    for h in beats.take_unstarted():
        completer.hand_back(h.fence)


def at_grace_over(beats: Heartbeater) -> None:
    """On the drain's background thread, once the grace period of a stop is over."""
    try:
        beats.flush()  # successes already finished are committed, not handed back
        beats.beat_now()  # confirms the abandoned handler: it ran (its task's result counts it)
    except Exception:  # noqa: BLE001  best effort: an unsettled success's lease decides
        logger.exception("could not commit finished successes, or beat, at shutdown")
    for h in beats.held():
        completer.hand_back(h.fence)
    if beats.stopped(ABANDON_SECONDS):
        return  # the handler returned meanwhile and the drain ended on its own
    logger.warning(
        "shutdown grace period over: abandoning the running handler; worker process %s exits",
        os.getpid(),
    )
    registry.before_exit()  # what this process's daemonic threads still owe (jobs.tasks' notices)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)  # the handler cannot be interrupted safely; its jobs are handed back
