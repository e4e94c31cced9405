"""The event tail's bookkeeping: one notice per read, skipped ids remembered until they appear."""

import asyncio
from typing import Any

import pytest

from dashboard import broadcast, live

pytestmark = pytest.mark.asyncio


@pytest.fixture
def notices(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def publish(message: dict[str, Any]) -> None:
        sent.append(message)

    monkeypatch.setattr(broadcast, "publish", publish)
    return sent


async def test_one_read_makes_one_notice_naming_each_changed_job_once(notices: list) -> None:
    tail = live.EventTail()
    tail.last_id = 10
    tail._handle([(11, 1, "claimed"), (12, 1, "succeeded"), (13, 2, "rejected")], now=0.0)
    await asyncio.sleep(0)  # let the publish task run
    assert notices == [
        {
            "type": "events.changed",
            "last_event_id": 13,
            "job_ids": [1, 2],
            "rejected": True,
            "overflow": False,
            "facts": [],
        }
    ]


async def test_an_id_skipped_over_is_remembered_until_its_transaction_commits(
    notices: list,
) -> None:
    tail = live.EventTail()
    tail.last_id = 10
    tail._handle([(11, 1, "claimed"), (13, 2, "claimed")], now=0.0)
    assert set(tail.gaps) == {12}
    tail._handle([(12, 3, "claimed")], now=1.0)  # the slower transaction committed
    await asyncio.sleep(0)
    assert tail.gaps == {}
    assert tail.last_id == 13
    assert notices[-1]["job_ids"] == [3]


async def test_more_changed_jobs_than_a_notice_carries_is_an_overflow(notices: list) -> None:
    tail = live.EventTail()
    tail.last_id = 0
    rows = [(i, i, "claimed") for i in range(1, broadcast.MAX_JOB_IDS + 10)]
    tail._handle(rows, now=0.0)
    await asyncio.sleep(0)
    assert notices[0]["overflow"] is True
    assert len(notices[0]["job_ids"]) == broadcast.MAX_JOB_IDS
