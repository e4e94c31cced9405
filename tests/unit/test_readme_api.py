"""README, "Using it": `jobs.enqueue(kind, payload=None, *, queue="default", priority=0,
run_at=None, max_attempts=None, lease_seconds=None, unique_key=None) -> Job`, also
`Job.objects.enqueue`. The signature Python reports (help(), an editor, inspect) is the one the
README writes, and a misspelled option is refused naming `enqueue`, not an internal helper."""

import ast
import inspect
import re
from pathlib import Path

import pytest

import jobs
from jobs.models import Job

PROJECT_DIR = Path(__file__).resolve().parents[2]


def _readme_signature() -> str:
    text = " ".join((PROJECT_DIR / "README.md").read_text().split())
    found = re.search(r"`jobs\.enqueue(\(kind, payload=None, \*, .*?\)) -> Job`", text)
    assert found, "the README no longer states jobs.enqueue's signature"
    return found[1]


def _parameters(signature: inspect.Signature) -> list[tuple[str, str, object]]:
    """(name, kind, default) of each parameter: what a caller meets, annotations aside."""
    return [(p.name, p.kind.name, p.default) for p in signature.parameters.values()]


def _readme_parameters() -> list[tuple[str, str, object]]:
    namespace: dict = {}
    exec(compile(ast.parse(f"def enqueue{_readme_signature()}: pass"), "README", "exec"), namespace)
    return _parameters(inspect.signature(namespace["enqueue"]))


@pytest.mark.parametrize("enqueue", [jobs.enqueue, Job.objects.enqueue], ids=["jobs", "manager"])
def test_enqueue_has_the_signature_the_readme_states(enqueue):
    assert _parameters(inspect.signature(enqueue)) == _readme_parameters()
    assert len(_readme_parameters()) == 8


@pytest.mark.parametrize("enqueue", [jobs.enqueue, Job.objects.enqueue], ids=["jobs", "manager"])
def test_a_misspelled_option_is_refused_naming_enqueue(enqueue):
    with pytest.raises(TypeError, match=r"enqueue\(\) got an unexpected keyword argument 'queu'"):
        enqueue("test.echo", queu="mail")
    with pytest.raises(TypeError, match=r"enqueue\(\) takes"):
        enqueue("test.echo", {}, "mail")  # the options are keyword-only
