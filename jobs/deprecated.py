"""Old module paths, importable for one more release with a DeprecationWarning.

The job platform's modules moved into rooms by role (jobs/core, jobs/worker, jobs/effects,
jobs/ops). Code that imports an old path -- `from jobs.transitions import requeue`, settings
naming "jobs.bridge.ResilientORMBroker", a django-q2 task queued before an upgrade as
"jobs.bridge.drain" -- keeps working: the finder below answers for the old name with the module
at its new path (the same module object, never a second copy) and warns once per old path.

Owns: the table MOVED and that finder. Never: holds code of its own. Remove it in the release
after next; docs/changelog.md lists the table for users.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

# old path -> new path; a submodule of an old package moves with it (jobs.sql.postgres ->
# jobs.core.sql.postgres).
MOVED = {
    "jobs.actions": "jobs.ops.actions",
    "jobs.bounds": "jobs.core.bounds",
    "jobs.bridge": "jobs.worker.bridge",
    "jobs.checks": "jobs.ops.checks",
    "jobs.completer": "jobs.worker.completer",
    "jobs.conf": "jobs.core.conf",
    "jobs.connectivity": "jobs.core.connectivity",
    "jobs.exceptions": "jobs.core.exceptions",
    "jobs.fenced": "jobs.effects.fenced",
    "jobs.heartbeat": "jobs.worker.heartbeat",
    "jobs.janitor": "jobs.effects.janitor",
    "jobs.logs": "jobs.ops.logs",
    "jobs.maintenance": "jobs.worker.maintenance",
    "jobs.metrics": "jobs.ops.metrics",
    "jobs.outbox": "jobs.effects.outbox",
    "jobs.pending": "jobs.effects.pending",
    "jobs.policy": "jobs.core.policy",
    "jobs.reaper": "jobs.worker.reaper",
    "jobs.registry": "jobs.core.registry",
    "jobs.retention": "jobs.ops.retention",
    "jobs.runner": "jobs.worker.runner",
    "jobs.scheduler": "jobs.worker.scheduler",
    "jobs.schedules": "jobs.ops.cron",
    "jobs.shutdown": "jobs.worker.shutdown",
    "jobs.sql": "jobs.core.sql",
    "jobs.staging": "jobs.effects.staging",
    "jobs.states": "jobs.core.states",
    "jobs.transitions": "jobs.core.transitions",
    "jobs.tuning": "jobs.ops.lease_hint",
    "jobs.unresolved": "jobs.worker.unresolved",
}
# Not in the table: jobs.enqueuer. Its `enqueue` is `jobs.enqueue()` (unchanged) and
# `Job.objects.enqueue()`; its validation is jobs.core.enqueue.validate().


def new_path(old: str) -> str | None:
    """The module an old path now names, or None when `old` did not move."""
    parts = old.split(".")
    if parts[0] != "jobs":
        return None
    for cut in range(len(parts), 1, -1):
        moved = MOVED.get(".".join(parts[:cut]))
        if moved is not None:
            return ".".join([moved, *parts[cut:]])
    return None


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old path with the module at its new path (see the module docstring)."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if new_path(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder; exec_module swaps in the real module

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        new = new_path(old)
        assert new is not None
        warnings.warn(
            f"{old} moved to {new}; the old path will be removed in the release after next",
            DeprecationWarning,
            stacklevel=2,
        )
        # The import system returns whatever sys.modules holds under the name once exec_module
        # ends: the real module, so `jobs.transitions is jobs.core.transitions`.
        sys.modules[old] = importlib.import_module(new)


def install() -> None:
    """Put the finder first, so an old submodule is never loaded a second time by path."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
