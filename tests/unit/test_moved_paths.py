"""Old module paths keep working for one release, with a DeprecationWarning, and each answers
with the very module at its new path (jobs/deprecated.py)."""

import importlib
import pydoc
import sys
import warnings
from pathlib import Path

import pytest

import jobs
from jobs import deprecated

ROOT = Path(__file__).resolve().parents[2]


def import_fresh(name: str) -> object:
    sys.modules.pop(name, None)  # only the alias: the real module stays loaded
    return importlib.import_module(name)


@pytest.mark.parametrize(("old", "new"), sorted(deprecated.MOVED.items()))
def test_an_old_path_warns_and_is_the_module_at_its_new_path(old, new):
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        module = import_fresh(old)
    assert module is importlib.import_module(new)


@pytest.mark.parametrize("old", sorted(deprecated.MOVED))
def test_an_old_path_is_no_longer_a_file_of_its_own(old):
    relative = Path(*old.split("."))
    assert not (ROOT / relative.with_suffix(".py")).exists(), old
    assert not (ROOT / relative).is_dir(), old


def test_a_submodule_of_an_old_package_is_the_same_module_not_a_second_copy():
    with pytest.warns(DeprecationWarning):
        old = import_fresh("jobs.sql.postgres")
    from jobs.core.sql import postgres

    assert old is postgres


def test_a_name_imported_from_an_old_path_is_the_same_object():
    with pytest.warns(DeprecationWarning):
        sys.modules.pop("jobs.transitions", None)
        from jobs.transitions import requeue
    from jobs.core.transitions import requeue as new_requeue

    assert requeue is new_requeue


def test_a_django_q2_task_queued_before_the_move_still_finds_its_function():
    # django-q2 resolves a task's function with pydoc.locate (django_q/worker.py).
    sys.modules.pop("jobs.bridge", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        found = pydoc.locate("jobs.bridge.drain")
    from jobs.worker import bridge

    assert found is bridge.drain


def test_a_path_that_did_not_move_is_left_to_the_import_system():
    assert deprecated.new_path("jobs.models") is None
    assert deprecated.new_path("jobs.context") is None
    assert deprecated.new_path("jobsx.transitions") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("jobs.no_such_module")


def test_the_documented_paths_import_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from jobs.context import JobContext
        from jobs.effects import send_mail

    assert jobs.JobContext is JobContext
    assert callable(send_mail)


def test_the_changelog_lists_every_moved_path_with_its_new_one():
    changelog = (ROOT / "docs" / "changelog.md").read_text()
    for old, new in deprecated.MOVED.items():
        assert f"| `{old}` | `{new}` |" in changelog, old


def test_an_old_module_imported_from_the_package_warns_and_is_the_new_one():
    sys.modules.pop("jobs.runner", None)
    vars(jobs).pop("runner", None)  # `from jobs import runner` looks for the attribute first
    with pytest.warns(DeprecationWarning, match="jobs.runner moved to jobs.worker.runner"):
        from jobs import runner
    from jobs.worker import runner as new_runner

    assert runner is new_runner
