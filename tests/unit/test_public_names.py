"""README, Layout: `jobs/__init__.py` holds "the public names: `enqueue`, `handler`, `JobContext`,
the exceptions", and the old paths of `jobs/deprecated.py` do not include `jobs.enqueuer`, "whose
`enqueue` was always `jobs.enqueue()` and still is": application code enqueues through `jobs`.
These tests hold the package to that sentence: the old module does not import (no file, no alias
with a warning), and the names `jobs` exports are the ones the README gives."""

import importlib
import inspect
import re
import sys
import warnings
from pathlib import Path

import pytest
from django.apps import apps

import jobs
from jobs import deprecated
from jobs.core import exceptions

PROJECT_DIR = Path(__file__).resolve().parents[2]
README = " ".join((PROJECT_DIR / "README.md").read_text().split())


def _layout_cell(room: str) -> str:
    found = re.search(rf"\| `{re.escape(room)}` \| ([^|]*) \|", README)
    assert found, f"the README's Layout table has no row for {room}"
    return found[1]


def test_the_readme_still_says_jobs_enqueuer_is_not_kept():
    assert "not `jobs.enqueuer`, whose `enqueue` was always `jobs.enqueue()`" in _layout_cell(
        "jobs/deprecated.py"
    )


def test_importing_jobs_enqueuer_fails_with_no_alias_and_no_warning():
    sys.modules.pop("jobs.enqueuer", None)
    assert deprecated.new_path("jobs.enqueuer") is None
    assert not (PROJECT_DIR / "jobs" / "enqueuer.py").exists()
    assert not (PROJECT_DIR / "jobs" / "enqueuer").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # not answered by the moved-path finder
        with pytest.raises(ModuleNotFoundError, match="jobs.enqueuer"):
            importlib.import_module("jobs.enqueuer")
        with pytest.raises(ImportError):
            from jobs import enqueuer  # noqa: F401
    assert not hasattr(jobs, "enqueuer")


def test_jobs_exports_the_names_the_readme_gives_and_the_exceptions():
    named = re.findall(r"`(\w+)`", _layout_cell("jobs/__init__.py").split(";")[0])
    assert named == ["enqueue", "handler", "JobContext"]
    raised = {name for name in jobs.__all__ if name not in named}
    assert set(jobs.__all__) == set(named) | raised and len(jobs.__all__) == len(set(jobs.__all__))
    for name in raised:  # "the exceptions": each one of jobs.core.exceptions, the root's family
        exc = getattr(jobs, name)
        assert inspect.isclass(exc) and issubclass(exc, exceptions.JobsError), name
        assert exc is getattr(exceptions, name)
    # Exactly the ones the README names as `jobs.<Name>`, and the two roots a caller catches
    # (JobsError; EnqueueError, docs/tasks.md): no internal one (AttemptEnded) exported by mistake.
    written = set(re.findall(r"\bjobs\.([A-Z]\w*)", README))
    assert raised == (written & raised) | {"JobsError", "EnqueueError"}
    assert written & {n for n, c in vars(exceptions).items() if inspect.isclass(c)} <= raised
    assert callable(jobs.enqueue) and callable(jobs.handler)
    assert jobs.JobContext is importlib.import_module("jobs.context").JobContext


def test_every_jobs_name_the_readme_writes_is_exported_or_a_model():
    # `jobs.Job`, `jobs.Attempt`, `jobs.RejectedWrite` are the app's models (Django's labels);
    # every other capitalised `jobs.<Name>` must be importable from `jobs` as written.
    written = set(re.findall(r"\bjobs\.([A-Z]\w*)", README))
    assert {"UnknownKind", "InvalidPayload", "LeaseLost", "Job"} <= written
    models = {m.__name__ for m in apps.get_app_config("jobs").get_models()}
    exported = set(jobs.__all__)
    assert sorted(written - models - exported) == []
    for name in written - models:
        assert getattr(jobs, name) is not None
