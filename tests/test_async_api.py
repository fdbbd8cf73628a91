"""The producer API from async code (an async view): no sync_to_async needed by the caller."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction

from django_eddyq.models import Job
from django_eddyq.worker import Worker
from tests import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_enqueue_and_follow_a_job_from_async_code(
    run_burst_worker: Callable[..., Worker],
) -> None:
    async def enqueue() -> tuple[Job, list[Job]]:
        one = await jobs.add.aenqueue(2, 3)
        many = await jobs.add.aenqueue_many([(1, 1), {"a": 2, "b": 2}])
        return one, many

    one, many = async_to_sync(enqueue)()
    assert [job.state for job in (one, *many)] == ["available"] * 3
    run_burst_worker()

    async def follow() -> Job:
        await one.arefresh()
        return one

    assert async_to_sync(follow)().result == 5


def test_cancel_and_retry_from_async_code() -> None:
    job = jobs.add.using(run_at=timedelta(hours=1)).enqueue(1, 2)

    async def cancel_then_retry() -> tuple[bool, str, bool, str]:
        cancelled = await job.acancel()
        after_cancel = job.state
        retried = await job.aretry()
        return cancelled, after_cancel, retried, job.state

    assert async_to_sync(cancel_then_retry)() == (True, "cancelled", True, "available")
    assert Job.objects.get(pk=job.pk).state == "available"


def test_an_async_enqueue_joins_the_async_orm_s_transaction() -> None:
    """Rolled back with the caller's transaction: nothing is left behind."""

    def enqueue_then_fail() -> None:
        with transaction.atomic():
            async_to_sync(jobs.add.aenqueue)(1, 1)
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    assert not Job.objects.exists()
