"""LeaseLost and AttemptEnded cross a process boundary intact (pickled, as a process pool, or
multiprocessing, hands a child's exception back): before, unpickling called the class with the
message alone and raised TypeError in place of the lease loss."""

import pickle

import pytest

from jobs.core.exceptions import AttemptEnded, LeaseLost


@pytest.mark.parametrize("cls", [LeaseLost, AttemptEnded])
def test_a_lease_loss_survives_a_pickle_round_trip(cls):
    exc = cls(7, 3, "commit")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert (back.job_id, back.attempt, back.write) == (7, 3, "commit")
    assert str(back) == str(exc)
