"""Atomic handlers, run by a worker in this process: what they write commits with their job's
completion, in one transaction, or not at all.

The fault suite (tests/faults/test_atomic_handlers.py) runs them in worker processes that are
killed and frozen.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

import django_eddyq
from demo.models import Execution
from django_eddyq import registry, task
from django_eddyq.backend import EddyqTask
from django_eddyq.compat import InvalidTask, InvalidTaskBackend, task_backends
from django_eddyq.models import Job
from django_eddyq.testing import run_jobs
from django_eddyq.worker import Worker
from tests import jobs
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]
COMMITTED = "on commit, the job was completed"


def refreshed(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def labels(job: Job) -> list[str]:
    """What the job's handler runs wrote, and what their on_commit callbacks did."""
    return list(Execution.objects.filter(job_id=job.pk).values_list("label", flat=True))


@contextmanager
def worker_running(**options: Any) -> Iterator[Worker]:
    worker = Worker(concurrency=2, maintenance=False, **options)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(10)
        jobs.Gate.opened.set()  # a handler left at the gate ends
        jobs.Gate.reset()


def completed_in_activity(queue: str = "default") -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(sum(completed), 0) FROM eddyq_activity WHERE queue = %s", [queue]
        )
        return int(cursor.fetchone()[0])


def test_a_completed_attempt_commits_its_writes_with_its_completion(
    run_burst_worker: RunWorker,
) -> None:
    job = jobs.atomic_writes.enqueue("paid")
    worker = run_burst_worker()

    stored = refreshed(job)
    assert (stored.state, stored.result, stored.attempt) == ("completed", "paid", 1)
    assert stored.finalized_at is not None and stored.locked_by is None
    # The on_commit callback ran once the completion had committed: it saw the job completed.
    assert labels(job) == ["paid", COMMITTED]
    assert worker.finished == 1 and worker.processed == 1
    assert completed_in_activity() == 1


@pytest.mark.parametrize(
    ("then", "state", "attempt", "error"),
    [
        ("raises", "retryable", 1, "ValueError: rolled back"),
        ("snoozes", "scheduled", 0, None),
        ("discards", "failed", 1, "Discard: rolled back"),
        ("breaks its transaction", "retryable", 1, "current transaction is aborted"),
    ],
)
def test_an_attempt_that_does_not_complete_rolls_its_writes_back(
    run_burst_worker: RunWorker, then: str, state: str, attempt: int, error: str | None
) -> None:
    job = jobs.atomic_writes.enqueue("rolled back", then)
    run_burst_worker()

    stored = refreshed(job)
    assert (stored.state, stored.attempt) == (state, attempt)
    # Its outcome was recorded after the rollback, as a plain handler's is.
    if error is None:
        assert stored.errors == []
    else:
        assert len(stored.errors) == 1 and error in stored.errors[0]["error"]
    assert labels(job) == []


def test_a_lost_lease_commits_nothing(
    fast_settings: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The job was taken from the worker while its handler ran (as the rescuer takes a job
    whose lease passed, and another worker completes it): the handler's writes roll back."""
    caplog.set_level(logging.INFO, logger="django_eddyq.worker.execution")
    job = jobs.atomic_writes.enqueue("too late", "waits at the gate")
    with worker_running() as worker:
        assert jobs.Gate.reached.wait(10)
        Job.all_objects.filter(pk=job.pk).update(
            state="completed", locked_by=None, locked_until=None, result="done elsewhere"
        )
        jobs.Gate.opened.set()
        wait_for(lambda: "what it wrote was rolled back" in caplog.text, seconds=10)

    stored = refreshed(job)
    assert (stored.state, stored.result, stored.errors) == ("completed", "done elsewhere", [])
    assert labels(job) == []
    assert worker.finished == 0  # its outcome was not stored: the job was not its own


def test_a_cancel_while_it_runs_rolls_its_writes_back(fast_settings: None) -> None:
    job = jobs.atomic_writes.enqueue("cancelled", "stops when cancelled")
    with worker_running():
        wait_for(lambda: refreshed(job).state == "running")
        assert refreshed(job).cancel() is True
        wait_for(lambda: refreshed(job).state == "cancelled", seconds=5)

    stored = refreshed(job)
    assert stored.attempt == 1 and stored.finalized_at is not None
    assert stored.errors[-1]["error"] == "RuntimeError: stopped because cancelled"
    assert labels(job) == []


def test_a_cancel_before_it_commits_refuses_its_completion(fast_settings: None) -> None:
    """A plain handler that returns after a cancel completes its job; an atomic one's
    completion is refused, and what it wrote rolled back."""
    job = jobs.atomic_writes.enqueue("finished anyway", "waits at the gate")
    with worker_running():
        assert jobs.Gate.reached.wait(10)
        assert refreshed(job).cancel() is True
        jobs.Gate.opened.set()
        wait_for(lambda: refreshed(job).state == "cancelled", seconds=5)

    stored = refreshed(job)
    assert stored.result is None and stored.attempt == 1
    [entry] = stored.errors
    assert entry["exception_class"] == "django_eddyq.exceptions.CompletionRefused"
    assert "cancelled or its lease lost" in entry["error"]
    assert labels(job) == []


def test_plain_jobs_are_finished_beside_atomic_ones(run_burst_worker: RunWorker) -> None:
    atomic = [jobs.atomic_writes.enqueue(f"atomic {n}") for n in range(20)]
    plain = jobs.add.enqueue_many([(n, 1) for n in range(20)])
    worker = run_burst_worker(concurrency=4)

    assert {refreshed(job).state for job in [*atomic, *plain]} == {"completed"}
    assert [refreshed(job).result for job in plain] == [n + 1 for n in range(20)]
    assert all(labels(job) == [f"atomic {n}", COMMITTED] for n, job in enumerate(atomic))
    assert worker.finished == 40
    assert completed_in_activity() == 40


def test_the_last_atomic_job_of_a_batch_completes_it(run_burst_worker: RunWorker) -> None:
    with django_eddyq.batch(on_complete=jobs.add, args=(1, 2)) as batch:
        members = [jobs.atomic_writes.enqueue(f"member {n}") for n in range(3)]
    run_burst_worker()

    batch.refresh_from_db()
    assert batch.state == "complete"
    assert all(refreshed(job).state == "completed" for job in members)
    callback = Job.objects.get(pk=batch.callback_job)
    assert callback.kwargs["counts"] == {"completed": 3, "failed": 0, "cancelled": 0}


def test_run_jobs_rolls_an_atomic_handlers_writes_back_as_a_worker_does() -> None:
    completed = jobs.atomic_writes.enqueue("kept")
    failed = jobs.atomic_writes.enqueue("dropped", "raises")
    run_jobs()
    assert refreshed(completed).state == "completed"
    assert labels(completed) == ["kept", COMMITTED]
    assert refreshed(failed).state == "retryable" and labels(failed) == []


# Declaring.


async def fetches() -> None: ...


def test_an_async_function_cannot_be_atomic() -> None:
    with pytest.raises(TypeError, match=r"test_atomic_handlers.fetches is async and cannot be"):
        task(atomic=True)(fetches)
    with pytest.raises(TypeError, match="atomic must be True or False, not 'yes'"):
        task(atomic="yes")(settles)  # type: ignore[call-overload]


def settles() -> None: ...


def test_a_task_says_whether_it_is_atomic() -> None:
    assert jobs.atomic_writes.atomic is True
    assert registry.handler(jobs.atomic_writes.path).atomic is True
    assert registry.handler(jobs.add.path).atomic is False


# Django's tasks.

TASKS = {"default": {"BACKEND": "django_eddyq.backend.EddyqBackend"}}


def django_task(func: Callable[..., Any], **options: Any) -> EddyqTask:
    fields = {"priority": 0, "backend": "default", "queue_name": "default", "run_after": None}
    return EddyqTask(func=func, **fields, **options)


def django_atomic_by_option() -> None: ...


def django_atomic_by_argument() -> None: ...


def django_plain_despite_option() -> None: ...


def django_plain() -> None: ...


async def django_async_on_atomic_backend() -> None: ...


async def django_async_atomic() -> None: ...


def test_a_django_task_is_atomic_by_its_argument_or_its_backends_option() -> None:
    with override_settings(TASKS={"default": {**TASKS["default"], "OPTIONS": {"ATOMIC": True}}}):
        assert task_backends["default"].atomic is True  # type: ignore[attr-defined]
        by_option = django_task(django_atomic_by_option)
        plain_despite_option = django_task(django_plain_despite_option, atomic=False)
        with pytest.raises(InvalidTask, match="is async and cannot be atomic"):
            django_task(django_async_on_atomic_backend)
    with override_settings(TASKS=TASKS):
        by_argument = django_task(django_atomic_by_argument, atomic=True)
        plain = django_task(django_plain)
        with pytest.raises(InvalidTask, match="is async and cannot be atomic"):
            django_task(django_async_atomic, atomic=True)
    for declared, atomic in [
        (by_option, True),
        (plain_despite_option, False),
        (by_argument, True),
        (plain, False),
    ]:
        assert registry.handler(declared.module_path).atomic is atomic


def test_the_backends_atomic_option_must_be_a_boolean() -> None:
    options = {"ATOMIC": "yes"}
    with (
        override_settings(TASKS={"default": {**TASKS["default"], "OPTIONS": options}}),
        pytest.raises(InvalidTaskBackend, match=r'\["ATOMIC"\] must be True or False, not .yes.'),
    ):
        task_backends["default"]
