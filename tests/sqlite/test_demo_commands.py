"""The demo's commands refuse hostile numbers before they touch the database: `seed_demo --add N`
took any integer (a negative one "enqueued -5 demo jobs"; a huge one enqueued without end in one
transaction, holding SQLite's only write lock), and `drill --seconds` slept a worker for as long
as it was told (or failed the drill job at once on a negative or NaN duration)."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from demo.management.commands import seed_demo
from jobs.models import Job

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("n", ["-5", "0", "10001", "1e9", "99999999999", "9" * 5000, "١٢", " 3"])
def test_seed_demo_refuses_a_count_out_of_range(n: str):
    with pytest.raises(CommandError, match="not a whole number from 1 to 10000"):
        call_command("seed_demo", f"--add={n}")
    assert not Job.objects.exists()


def test_seed_demo_adds_up_to_its_bound_a_batch_at_a_time(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(seed_demo, "BATCH", 4)  # 10 is not a multiple: the last batch is short
    call_command("seed_demo", "--add=10")
    assert Job.objects.count() == 10
    call_command("seed_demo", f"--add={seed_demo.MAX_JOBS}")
    assert Job.objects.count() == 10 + seed_demo.MAX_JOBS


@pytest.mark.parametrize(
    "arg", ["--seconds=-1", "--seconds=nan", "--seconds=1e9", "--timeout=inf", "--timeout=-5"]
)
def test_drill_refuses_a_duration_out_of_range(arg: str):
    with pytest.raises(CommandError, match="is not a number from"):
        call_command("drill", arg)
    assert not Job.objects.exists()
