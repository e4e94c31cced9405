"""Tables of the tests' own: FencedRow models shaped as applications shape theirs."""

from django.db import models

from demo.models import Report
from jobs.models import FencedRow


class ChildReport(Report):
    """A multi-table child of a FencedRow model: its fence columns live in its parent's table."""

    extra = models.CharField(max_length=20, blank=True, default="")


class Ledger(FencedRow):
    """A FencedRow table the application manages itself (`managed = False`; its migration
    creates the table)."""

    name = models.CharField(max_length=50, unique=True)
    body = models.TextField(blank=True, default="")

    class Meta:
        managed = False
        db_table = "tests_app_ledger"


class Note(FencedRow):
    """A FencedRow table that refers to a report; deleting the report sets `report` to NULL."""

    report = models.ForeignKey(Report, null=True, on_delete=models.SET_NULL)
    text = models.CharField(max_length=50, blank=True, default="")


class HidingManager(models.Manager["HidingNote"]):
    """Hides the notes whose text starts with "archived", as a soft delete's manager does."""

    def get_queryset(self) -> models.QuerySet["HidingNote"]:
        return super().get_queryset().exclude(text__startswith="archived")


class HidingNote(Note):
    """Note, with a default manager that hides rows (`objects`) beside one that does not
    (`every`): a queryset of `every` still names the hidden rows."""

    objects = HidingManager()
    every = models.Manager()

    class Meta:
        proxy = True
        default_manager_name = "objects"
