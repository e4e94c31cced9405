"""The layout is the architecture: imports only run downward, no module outgrows a screen of
thought, and job kinds live where they belong. The import contracts themselves are in
pyproject.toml ([tool.importlinter]); bin/test runs `lint-imports` beside ruff and mypy."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.core import registry

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
MAX_LINES = 400


def jobs_modules() -> list[Path]:
    return sorted(p for p in (ROOT / "jobs").rglob("*.py") if "migrations" not in p.parts)


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def tree_copy(tmp_path):
    """The project's packages and import contracts, copied to plant an import in."""
    for package in ("jobs", "dashboard", "demo", "config"):
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_import_contracts_hold():
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        ("jobs/core/bounds.py", "from jobs.worker import runner", "imports only run downward"),
        ("jobs/effects/staging.py", "from jobs import context", "imports only run downward"),
        ("jobs/models/job.py", "from jobs.ops import actions", "imports only run downward"),
        ("jobs/core/exceptions.py", "from jobs.core import registry", "no import cycles"),
        ("jobs/ops/retention.py", "import dashboard.selectors", "never imports the screens"),
        ("jobs/worker/runner.py", "import demo.handlers", "never imports the screens, the demo"),
        ("jobs/core/conf.py", "from config import settings", "the demo or the settings"),
        ("dashboard/selectors.py", "from jobs.worker import bridge", "never imports the worker"),
    ],
)
def test_a_planted_import_that_breaks_the_layout_fails_the_check(
    tree_copy, module, planted, broken
):
    path = tree_copy / module
    # Inside a function: a lazy import hides nothing from the check.
    path.write_text(path.read_text() + f"\n\ndef _planted() -> None:\n    {planted}  # noqa\n")
    run = lint_imports(tree_copy)
    assert run.returncode != 0, run.stdout
    broken_section = run.stdout.split("Broken contracts", 1)[-1]
    assert broken in broken_section, run.stdout


@pytest.mark.parametrize("path", jobs_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_in_jobs_outgrows_a_screen_of_thought(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it by concern"


@pytest.mark.parametrize("path", jobs_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_in_jobs_opens_with_what_it_owns(path):
    tree = ast.parse(path.read_text())
    if tree.body:  # an empty package marker needs no words
        assert ast.get_docstring(tree), f"{path.relative_to(ROOT)} opens with no docstring"


def test_demo_job_kinds_are_defined_only_in_the_demo_app():
    registry.autodiscover()
    homes = {kind: h.fn.__module__ for kind, h in registry._handlers.items()}
    assert any(kind.startswith("demo.") for kind in homes)
    for kind, module in homes.items():
        assert not module.startswith(("jobs.", "dashboard.", "config.")), (kind, module)
        if kind.startswith("demo."):
            assert module.startswith("demo."), (kind, module)


def _within(name: str, rooms: tuple[str, ...]) -> bool:
    return any(name == room or name.startswith(room + ".") for room in rooms)


def test_the_package_root_imports_only_core_and_deprecated_and_the_rest_on_first_use():
    # `jobs/__init__.py` is no room of the layers contract (only its children are): what it may
    # import is checked here. At import: jobs.core and jobs.deprecated (and the standard
    # library); jobs.models and jobs.context only inside a function, on first use.
    tree = ast.parse((ROOT / "jobs" / "__init__.py").read_text())
    in_functions = {
        id(node) for f in tree.body if isinstance(f, ast.FunctionDef) for node in ast.walk(f)
    }
    at_import, on_first_use = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"jobs.{a.name}" if node.module == "jobs" else node.module for a in node.names]
        else:
            continue
        found = on_first_use if id(node) in in_functions else at_import
        found.update(n for n in names if _within(n, ("jobs",)))
    assert at_import and all(_within(n, ("jobs.core", "jobs.deprecated")) for n in at_import)
    first_use = ("jobs.core", "jobs.deprecated", "jobs.models", "jobs.context")
    assert all(_within(n, first_use) for n in on_first_use), on_first_use


def test_the_web_process_loads_no_worker_module():
    """What the web process imports (settings, every app's admin and handlers, the URLs, the
    websocket routes, the handler's context for type hints) never pulls in jobs.worker."""
    code = (
        "import sys, django; django.setup()\n"
        "import config.asgi, config.urls, dashboard.routing, jobs.context\n"
        "from django.urls import get_resolver; get_resolver().url_patterns\n"
        "print(sorted(m for m in sys.modules if m.startswith('jobs.worker')))\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PALISADE_ENV_FILE": "none",
        "DJANGO_DEBUG": "1",
    }
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout
