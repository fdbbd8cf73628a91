"""``current_job()``: inside a handler, the job it runs for."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from django_eddyq import current_job
from django_eddyq.models import Job
from django_eddyq.tasks import QUEUE_METADATA_KEYS
from django_eddyq.worker import Worker
from tests import jobs

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]


@pytest.mark.parametrize("task", [jobs.knows_its_job, jobs.async_knows_its_job])
def test_a_handler_knows_its_job(task: object, run_burst_worker: RunWorker) -> None:
    assert current_job() is None  # outside a job
    enqueued = task.using(  # type: ignore[attr-defined]
        queue="reports", metadata={"request_id": "r-42"}
    ).enqueue()
    run_burst_worker()
    stored = Job.objects.get(pk=enqueued.pk)
    assert stored.result == enqueued.pk
    seen = jobs.CONTEXTS.pop(enqueued.pk)
    assert seen == {
        "task": task.path,  # type: ignore[attr-defined]
        "queue": "reports",
        "attempt": 1,
        "max_attempts": stored.max_attempts,
        "batch_id": None,
        "metadata": {"request_id": "r-42"},
        "enqueued_at": stored.created_at,
        "due_at": stored.run_at,
    }


def test_metadata_is_stored_and_checked() -> None:
    job = jobs.add.using(metadata={"tenant": 7}).enqueue(1, 2)
    assert Job.objects.get(pk=job.pk).metadata == {"tenant": 7}
    with pytest.raises(ValueError, match=r"metadata keys \['periodic'\] are the queue's own"):
        jobs.add.using(metadata={"periodic": "mine"})
    with pytest.raises(TypeError, match=r"metadata\['tags'\] is an object of type set"):
        jobs.add.using(metadata={"tags": {1, 2}})
    assert "django_tasks_backend" in QUEUE_METADATA_KEYS


def test_the_due_time_of_a_delayed_job(run_burst_worker: RunWorker) -> None:
    job = jobs.knows_its_job.using(run_at=timedelta(seconds=0)).enqueue()
    run_burst_worker()
    seen = jobs.CONTEXTS.pop(job.pk)
    assert seen["due_at"] >= seen["enqueued_at"]
