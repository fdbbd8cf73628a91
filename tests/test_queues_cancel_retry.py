"""Pausing queues, cancelling and retrying jobs: in this process and with real workers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection

import django_eddyq
from django_eddyq.models import Job, Queue
from django_eddyq.worker import Worker
from tests import jobs
from tests.conftest import FAST_SETTINGS
from tests.factories import JobFactory
from tests.processes import StartWorker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]


def state_of(job: Job) -> str:
    return Job.all_objects.get(pk=job.pk).state


# Queues.


def test_pause_and_resume_create_the_queue_row_and_return_it() -> None:
    paused = django_eddyq.pause_queue("reports")
    assert isinstance(paused, Queue)
    assert paused.is_paused
    assert django_eddyq.pause_queue("reports").paused_at == paused.paused_at  # idempotent
    resumed = django_eddyq.resume_queue("reports")
    assert not resumed.is_paused
    queue = Queue.objects.get(name="reports")
    assert queue.pause() is queue and queue.is_paused
    assert not queue.resume().is_paused
    with pytest.raises(ValueError, match="queue name"):
        django_eddyq.pause_queue("bad name")


def test_workers_do_not_claim_from_a_paused_queue(run_burst_worker: RunWorker) -> None:
    django_eddyq.pause_queue("held")
    held = jobs.add.using(queue="held").enqueue(1, 1)
    free = jobs.add.enqueue(2, 2)
    run_burst_worker()
    assert (state_of(held), state_of(free)) == ("available", "completed")
    django_eddyq.resume_queue("held")
    run_burst_worker()
    assert state_of(held) == "completed"


def test_enqueue_creates_the_queue_row() -> None:
    jobs.add.using(queue="brand-new").enqueue(1, 1)
    assert Queue.objects.filter(name="brand-new").exists()


def test_a_paused_queue_stops_an_idle_worker_and_resume_wakes_it(
    start_worker: StartWorker,
) -> None:
    start_worker("--concurrency", "2")
    first = jobs.add.using(queue="switch").enqueue(1, 1)
    wait_for(lambda: state_of(first) == "completed")
    django_eddyq.pause_queue("switch")
    second = jobs.add.using(queue="switch").enqueue(2, 2)
    time.sleep(0.5)  # several poll intervals (100ms) of the worker: it must not claim
    assert state_of(second) == "available"
    django_eddyq.resume_queue("switch")
    wait_for(lambda: state_of(second) == "completed", seconds=5)


# Cancellation.


@pytest.mark.parametrize("state", ["available", "scheduled", "retryable"])
def test_cancel_a_job_not_yet_running(state: str) -> None:
    job = JobFactory(state=state)
    assert job.cancel() is True
    assert job.state == Job.State.CANCELLED  # the instance is refreshed
    assert job.finalized_at is not None
    assert job.cancel() is False


@pytest.mark.parametrize("state", ["completed", "failed", "cancelled"])
def test_cancelling_a_terminal_job_changes_nothing(state: str) -> None:
    job = JobFactory(state=state)
    assert job.cancel() is False
    assert job.state == state


def test_a_cancelled_running_async_handler_ends_cancelled(fast_settings: None) -> None:
    long = jobs.async_waits.enqueue(60)
    worker = Worker(concurrency=2, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: state_of(long) == "running")
        assert Job.objects.get(pk=long.pk).cancel() is True
        wait_for(lambda: state_of(long) == "cancelled", seconds=5)
    finally:
        worker.stop()
        thread.join(10)
    stored = Job.objects.get(pk=long.pk)
    assert stored.finalized_at is not None
    assert stored.errors[-1]["error"].startswith("CancelledError")


def test_a_cancelled_sync_handler_that_raises_ends_cancelled_not_retried(
    fast_settings: None,
) -> None:
    job = jobs.fails_when_cancelled.enqueue()
    worker = Worker(concurrency=1, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: state_of(job) == "running")
        Job.objects.get(pk=job.pk).cancel()
        wait_for(lambda: state_of(job) == "cancelled", seconds=5)
    finally:
        worker.stop()
        thread.join(10)
    stored = Job.objects.get(pk=job.pk)
    assert stored.attempt == 1
    assert stored.errors[-1]["error"] == "RuntimeError: stopped because cancelled"


def test_a_cancelled_handler_that_returns_anyway_ends_completed(fast_settings: None) -> None:
    job = jobs.sleep.enqueue(0.6, "done anyway")
    worker = Worker(concurrency=1, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: state_of(job) == "running")
        Job.objects.get(pk=job.pk).cancel()
        wait_for(lambda: state_of(job) == "completed", seconds=5)
    finally:
        worker.stop()
        thread.join(10)
    assert Job.objects.get(pk=job.pk).result == "done anyway"


def test_the_worker_learns_of_a_cancel_at_its_heartbeat_without_notifications() -> None:
    from django.test import override_settings

    settings = {**FAST_SETTINGS, "LISTEN_NOTIFY": False, "HEARTBEAT_INTERVAL": "200ms"}
    with override_settings(EDDYQ=settings):
        job = jobs.fails_when_cancelled.enqueue()
        worker = Worker(concurrency=1, maintenance=False)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            wait_for(lambda: state_of(job) == "running")
            Job.objects.get(pk=job.pk).cancel()
            wait_for(lambda: state_of(job) == "cancelled", seconds=5)
        finally:
            worker.stop()
            thread.join(10)


def test_a_stuck_cancelled_job_is_rescued_as_cancelled() -> None:
    from django_eddyq.maintenance import Rescuer

    job = JobFactory(state=Job.State.RUNNING, attempt=1, locked_by="gone:1:x")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE eddyq_jobs SET locked_until = now() - interval '1 second', "
            "cancel_requested_at = now() WHERE id = %s",
            [job.pk],
        )
    assert Rescuer().run_once() == 1
    assert state_of(job) == "cancelled"


def test_concurrent_cancels_succeed_once() -> None:
    job = JobFactory(state=Job.State.AVAILABLE)
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def cancel() -> None:
        barrier.wait()
        results.append(Job.objects.get(pk=job.pk).cancel())
        connection.close()

    threads = [threading.Thread(target=cancel) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results) == [False] * 7 + [True]
    assert state_of(job) == "cancelled"


# Retry.


@pytest.mark.parametrize("state", ["failed", "cancelled", "retryable", "scheduled"])
def test_retry_makes_a_job_available_now_keeping_its_errors(state: str) -> None:
    job = JobFactory(failed=True, state=state)
    Job.objects.filter(pk=job.pk).update(result=1)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE eddyq_jobs SET run_at = now() + interval '1 hour' WHERE id = %s", [job.pk]
        )
    assert job.retry() is True
    assert job.state == Job.State.AVAILABLE
    assert job.finalized_at is None and job.result is None
    assert len(job.errors) == 1


def test_retry_grants_one_more_attempt_when_all_were_used() -> None:
    job = JobFactory(failed=True, attempt=3, max_attempts=3)
    job.retry()
    assert (job.attempt, job.max_attempts) == (3, 4)
    spare = JobFactory(failed=True, attempt=1, max_attempts=3)
    spare.retry()
    assert spare.max_attempts == 3


def test_retrying_a_completed_job_raises() -> None:
    job = JobFactory(finished=True)
    with pytest.raises(ValueError, match="completed"):
        job.retry()
    assert state_of(job) == "completed"


@pytest.mark.parametrize("state", ["available", "running"])
def test_retrying_an_available_or_running_job_changes_nothing(state: str) -> None:
    job = JobFactory(state=state)
    assert job.retry() is False
    assert state_of(job) == state


def test_a_retried_job_runs_again(run_burst_worker: RunWorker) -> None:
    job = jobs.discard.enqueue("once")
    run_burst_worker()
    assert state_of(job) == "failed"
    Job.objects.get(pk=job.pk).retry()
    run_burst_worker()
    stored = Job.objects.get(pk=job.pk)
    assert stored.state == "failed"
    assert [entry["attempt"] for entry in stored.errors] == [1, 2]


def test_concurrent_cancel_and_retry_leave_a_consistent_job() -> None:
    job = JobFactory(failed=True)
    barrier = threading.Barrier(10)
    errors: list[BaseException] = []

    def act(index: int) -> None:
        barrier.wait()
        try:
            fresh = Job.objects.get(pk=job.pk)
            if index % 2:
                fresh.retry()
            else:
                fresh.cancel()
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=act, args=(n,)) for n in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == []
    final = Job.all_objects.get(pk=job.pk)
    assert final.state in {"available", "cancelled"}
    assert (final.finalized_at is None) == (final.state == "available")


def test_run_at_in_retry_is_the_database_clock() -> None:
    job = JobFactory(failed=True)
    job.retry()
    with connection.cursor() as cursor:
        cursor.execute("SELECT now() - run_at FROM eddyq_jobs WHERE id = %s", [job.pk])
        assert cursor.fetchone()[0] < timedelta(seconds=5)


def test_an_async_handler_that_catches_the_cancel_and_returns_completes(
    fast_settings: None,
) -> None:
    job = jobs.async_shrugs_off_cancel.enqueue()
    worker = Worker(concurrency=1, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: state_of(job) == "running")
        Job.objects.get(pk=job.pk).cancel()
        wait_for(lambda: state_of(job) == "completed", seconds=5)
    finally:
        worker.stop()
        thread.join(10)
    assert Job.objects.get(pk=job.pk).result == "finished my work"


def test_a_job_cancelled_while_running_is_not_handed_back_at_shutdown(
    fast_settings: None,
) -> None:
    job = jobs.nap.enqueue(30)
    worker = Worker(concurrency=1, maintenance=False, shutdown_timeout=0.2)
    thread = threading.Thread(target=worker.run)
    thread.start()
    wait_for(lambda: state_of(job) == "running")
    Job.objects.get(pk=job.pk).cancel()
    time.sleep(0.3)  # the worker hears of the cancel
    worker.stop()
    thread.join(10)
    assert state_of(job) == "cancelled"
