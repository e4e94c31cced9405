"""Unknown kinds cost a bounded memory: a name no handler could have is refused before any
lookup (enqueue) or any resolver (get_handler), and the kinds the task resolver looked for in
vain are remembered up to MAX_MISSES, the least recently asked forgotten first."""

import pytest

import jobs
from jobs.core.registry import get_handler, handler
from jobs.tasks import execution

BIG = "x1." + "a" * 1_000_000  # an unknown kind of 1 MB


@pytest.fixture
def misses(monkeypatch):
    """A fresh memory of misses for this test (the process's own is left as it was)."""
    monkeypatch.setattr(execution, "_misses", type(execution._misses)())
    return lambda: execution._misses


def test_enqueue_refuses_a_kind_that_does_not_fit_before_looking_it_up(misses):
    for i in range(20):
        with pytest.raises(jobs.InvalidOption, match="at most 100 characters"):
            jobs.enqueue(f"{i}{BIG}")
    assert len(misses()) == 0


@pytest.mark.parametrize("kind", [BIG, "not a.kind", "test.echo\n", "test." + "y" * 96, "-a.b"])
def test_a_name_no_handler_could_have_is_never_resolved_nor_remembered(misses, kind):
    with pytest.raises(jobs.UnknownKind) as excinfo:
        get_handler(kind)
    assert len(str(excinfo.value)) < 300
    execution.resolve(kind)
    assert len(misses()) == 0


def test_the_misses_are_bounded_and_the_least_recently_asked_is_forgotten_first(misses):
    limit = getattr(execution, "MAX_MISSES", 1024)
    for i in range(limit + 50):
        with pytest.raises(jobs.UnknownKind):
            get_handler(f"nowhere.kind{i}")
    assert len(misses()) == limit
    assert "nowhere.kind49" not in misses() and "nowhere.kind50" in misses()
    with pytest.raises(jobs.UnknownKind):
        get_handler("nowhere.kind50")  # asked again: now the most recent
    execution.resolve("nowhere.new")  # one more miss: the oldest, now kind51, is forgotten
    assert "nowhere.kind50" in misses() and "nowhere.kind51" not in misses()


def test_a_handler_kind_ending_in_a_newline_is_refused():
    with pytest.raises(jobs.InvalidOption, match="a handler kind must match"):
        handler("test.newline\n")
