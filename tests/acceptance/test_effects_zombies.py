"""Every write path beyond the job row, against real `manage.py qcluster` processes: a stopped
worker (SIGSTOP past its lease, then SIGCONT) and a killed one (SIGKILL) leave no trace -- no
second performed effect at a real HTTP receiver, no staged output left behind, and the committed
output never touched."""

from pathlib import Path

import pytest

from jobs import enqueue
from jobs.models import IdempotencyKey, Intent, Job, JobEvent, StagedOutput
from tests.acceptance.cluster import (
    pause_first_attempt_until_reclaimed,
    wait_for_attempt,
    wait_for_db_clock_past,
    wait_for_outcome,
    wait_for_rejection,
    wait_for_state,
    wait_until,
    worker_pid,
)
from tests.receiver import receiver

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def _stop_inside_the_handlers_sleep(cluster, job_id: int) -> int:
    first = wait_for_attempt(job_id, 1, poll=0.01)
    pid = worker_pid(first.worker)
    wait_until(
        lambda: cluster.sleeping(pid),
        timeout=10,
        what=f"worker {pid} to be inside the handler's sleep",
        job_id=job_id,
        poll=0.005,
    )
    cluster.pause(pid)
    return pid


def test_a_zombie_and_its_replacement_reach_one_effect_the_receiver_performs_it_once(
    start_qcluster,
):
    with receiver() as r:
        cluster = start_qcluster()
        # Attempt 1 posts, then stalls inside the effect before recording it.
        job = enqueue("test.effects", {"webhook": f"{r.url}/hook", "in_effect": {"1": 1.5}})
        key = f"{job.pk}:notify"
        wait_until(lambda: r.posts() == 1, timeout=20, what="attempt 1's post", job_id=job.pk)
        zombie = _stop_inside_the_handlers_sleep(cluster, job.pk)
        wait_for_outcome(job.pk, 1, {"expired"})

        done = wait_for_state(job.pk, "succeeded")
        assert done.attempt == 2
        cluster.resume(zombie)
        rejected = wait_for_rejection(job.pk, 1, {"effect"})

        # One performed effect and one deduplicated repeat, both under the same key.
        assert r.verdicts(key) == ["performed", "deduplicated"]
        assert r.keys() == {key}
        row = IdempotencyKey.objects.get(key=key)
        assert (row.status, row.attempt, row.performs) == ("done", 2, 2)
        assert (rejected.attempt_current, rejected.resource) == (2, f"effect {key}")
        # The zombie could not record its completion over attempt 2's, nor commit.
        assert Job.objects.get(pk=job.pk).result["effect"]["verdict"] == "deduplicated"
        assert row.result["verdict"] == "deduplicated"


def test_a_zombies_staged_output_is_deleted_by_the_zombie(start_qcluster, tmp_path: Path):
    media = tmp_path / "media"
    cluster = start_qcluster(MEDIA_ROOT=str(media))
    job = enqueue("test.effects", {"stage": "out.txt", "after_stage": {"1": 1.5}})
    zombie = _stop_inside_the_handlers_sleep(cluster, job.pk)
    zombie_file = media / f"jobs/{job.pk}/attempt-1/out.txt"
    assert zombie_file.read_text() == "output of attempt 1"
    wait_for_outcome(job.pk, 1, {"expired"})
    done = wait_for_state(job.pk, "succeeded")
    assert done.result_ref == f"jobs/{job.pk}/attempt-2/"

    cluster.resume(zombie)

    wait_until(
        lambda: StagedOutput.objects.filter(job=job, attempt=1, status="discarded").exists(),
        timeout=20,
        what="the zombie to discard its output",
        job_id=job.pk,
    )
    assert not zombie_file.exists()
    assert (media / f"jobs/{job.pk}/attempt-2/out.txt").read_text() == "output of attempt 2"
    assert Job.objects.get(pk=job.pk).result_ref == f"jobs/{job.pk}/attempt-2/"


def test_a_killed_workers_output_is_found_by_the_janitor_and_the_committed_one_kept(
    start_qcluster, tmp_path: Path
):
    media = tmp_path / "media"
    cluster = start_qcluster(MEDIA_ROOT=str(media), JOBS_ORPHAN_GRACE_SECONDS="1")
    job = enqueue("test.effects", {"stage": "out.txt", "after_stage": {"1": 30}})
    orphan = media / f"jobs/{job.pk}/attempt-1/out.txt"
    killed = wait_for_attempt(job.pk, 1, poll=0.01)
    wait_until(orphan.exists, timeout=20, what="attempt 1's output", job_id=job.pk)
    cluster.kill(worker_pid(killed.worker))

    done = wait_for_state(job.pk, "succeeded", timeout=30)
    kept = media / f"jobs/{job.pk}/attempt-{done.attempt}/out.txt"
    event = wait_until(
        lambda: JobEvent.objects.filter(job=job, type="orphaned").first(),
        timeout=20,
        what="the janitor to report the orphan",
        job_id=job.pk,
    )
    assert (event.attempt, event.data["path"]) == (1, f"jobs/{job.pk}/attempt-1/out.txt")
    assert event.data["age_seconds"] >= 1
    assert not orphan.exists()
    assert "orphaned output deleted" in cluster.log()
    wait_until(
        lambda: StagedOutput.objects.filter(job=job, status="promoted").exists(),
        timeout=20,
        what="the janitor to mark the committed output promoted",
        job_id=job.pk,
    )
    assert kept.read_text() == f"output of attempt {done.attempt}"
    assert Job.objects.get(pk=job.pk).result_ref == f"jobs/{job.pk}/attempt-{done.attempt}/"


def test_a_zombies_intent_never_reaches_the_outbox_the_replacements_is_relayed_once(
    start_qcluster, tmp_path: Path
):
    with receiver() as r:
        cluster = start_qcluster(MEDIA_ROOT=str(tmp_path / "media"))
        hook = {"url": f"{r.url}/hook", "check_url": f"{r.url}/check"}
        job = enqueue(
            "test.effects",
            {"stage": "out.txt", "after_stage": {"1": 1.5}, "intent": {"data": hook}},
        )
        zombie = _stop_inside_the_handlers_sleep(cluster, job.pk)
        wait_for_outcome(job.pk, 1, {"expired"})
        wait_for_state(job.pk, "succeeded")
        cluster.resume(zombie)  # records its intent, then presents a commit that is rejected
        wait_for_rejection(job.pk, 1, {"commit", "heartbeat"})
        wait_until(  # the zombie's handler returned and its work was dropped, intent included
            lambda: StagedOutput.objects.filter(job=job, attempt=1, status="discarded").exists(),
            timeout=20,
            what="the zombie to discard its work",
            job_id=job.pk,
        )
        wait_until(
            lambda: Intent.objects.filter(job=job, state="done").exists(),
            timeout=20,
            what="the embedded relay to perform the intent",
            job_id=job.pk,
        )
        assert list(Intent.objects.filter(job=job).values_list("attempt", "performs")) == [(2, 1)]
        assert [(k, v, body) for k, v, body in r.calls] == [
            (f"{job.pk}:publish", "performed", {"attempt": 2})
        ]


def test_a_zombies_commit_presented_while_the_replacement_runs_brings_no_intent(
    start_qcluster, tmp_path: Path
):
    # The test above resumes the zombie after the replacement committed, whose intent then holds
    # the (job, step) key: a zombie's intent would be dropped by that conflict alone. Here its
    # commit reaches the database first, while attempt 2 still runs.
    with receiver() as r:
        cluster = start_qcluster(MEDIA_ROOT=str(tmp_path / "media"))
        hook = {"url": f"{r.url}/hook", "check_url": f"{r.url}/check"}
        job = enqueue(
            "test.effects",
            {"stage": "out.txt", "after_stage": {"1": 1.5, "2": 4}, "intent": {"data": hook}},
        )
        reclaimed = pause_first_attempt_until_reclaimed(cluster, job.pk)
        wait_for_db_clock_past(job.pk, reclaimed.paused_at, 1.5)
        cluster.resume(reclaimed.zombie)
        rejected = wait_for_rejection(job.pk, 1, {"commit"})
        assert (rejected.attempt_current, rejected.state_current) == (2, "running")
        assert not Intent.objects.filter(job=job).exists()  # nothing of the zombie's commit
        wait_for_state(job.pk, "succeeded")
        wait_until(
            lambda: Intent.objects.filter(job=job, state="done").exists(),
            timeout=20,
            what="the embedded relay to perform the intent",
            job_id=job.pk,
        )
        assert list(Intent.objects.filter(job=job).values_list("attempt", "performs")) == [(2, 1)]
        assert [(k, v, body) for k, v, body in r.calls] == [
            (f"{job.pk}:publish", "performed", {"attempt": 2})
        ]
