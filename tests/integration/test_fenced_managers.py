"""Token-checked writes take every row of the queryset they are given, whatever the model's
default manager hides (a soft delete's manager): `tests_app.HidingNote`'s default manager hides
notes whose text starts with "archived", its `every` manager does not.

They used to lock and write the rows the *default* manager could see among the queryset's: a
row it hides was left as it was, the write not refused -- `fenced_write` returned fewer rows
than the queryset holds, and `fenced_delete` left rows behind, both "all" by their own count.
"""

import pytest

import jobs
from jobs.models import Job
from tests.app.models import HidingNote, Note
from tests.integration.attempts import claim

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "host-a:1"


def notes() -> tuple[Job, list[int]]:
    job = jobs.enqueue("test.echo")
    shown = Note.objects.create(text="shown")
    hidden = Note.objects.create(text="archived")
    assert not HidingNote.objects.filter(pk=hidden.pk).exists()  # the default manager hides it
    return job, [shown.pk, hidden.pk]


def test_fenced_write_updates_every_row_of_the_queryset_even_one_the_default_manager_hides():
    job, pks = notes()
    running = claim(WORKER)
    written = running.ctx.fenced_write(HidingNote.every.filter(pk__in=pks), text="archived too")
    assert written == 2
    rows = Note.objects.filter(pk__in=pks).values_list("text", "fence_job_id", "fence_attempt")
    assert sorted(rows) == [("archived too", job.pk, 1)] * 2


def test_fenced_delete_deletes_every_row_of_the_queryset_even_one_the_default_manager_hides():
    _, pks = notes()
    running = claim(WORKER)
    assert running.ctx.fenced_delete(HidingNote.every.filter(pk__in=pks)) == 2
    assert not Note.objects.filter(pk__in=pks).exists()
