"""A qcluster worker process freezes the objects it starts with (jobs.worker.bridge): a full
garbage collection during a drain then walks only what the drain made, not all of Django."""

import pytest

import jobs
from tests.acceptance.cluster import wait_for_state

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def test_a_worker_process_keeps_its_startup_objects_out_of_the_collectors_walk(start_qcluster):
    start_qcluster()
    job = jobs.enqueue("test.gc_state")
    state = wait_for_state(job.pk, "succeeded", timeout=60).result
    # Django, the apps and django-q2 are tens of thousands of objects; a frozen heap holds them.
    assert state["frozen"] > 20_000, state
    assert state["walked"] < state["frozen"], state
