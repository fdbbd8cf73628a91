"""Bulk retry, cancel and delete (``django_eddyq.bulk``) over a ``JobFilter``: the single-job
rules, dry runs, batches each in a transaction of its own, resuming a walk, and the
notifications and batch completions the single operations owe."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from django_eddyq import bulk, db
from django_eddyq.models import Batch, Job
from django_eddyq.operations import ChangedJob
from django_eddyq.selection import JobFilter
from tests.factories import BatchFactory, JobFactory
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ALL = JobFilter()


def one_of_each_state() -> dict[str, Job]:
    now = timezone.now()
    return {
        "available": JobFactory(),
        "scheduled": JobFactory(state=Job.State.SCHEDULED, run_at=now + timedelta(hours=1)),
        "retryable": JobFactory(state=Job.State.RETRYABLE, attempt=1),
        "running": JobFactory(state=Job.State.RUNNING, attempt=1, locked_by="w-1"),
        "completed": JobFactory(finished=True),
        "failed": JobFactory(failed=True),
        "cancelled": JobFactory(state=Job.State.CANCELLED, finalized_at=now),
    }


def states(jobs: dict[str, Job]) -> dict[str, str]:
    return {name: Job.all_objects.get(pk=job.pk).state for name, job in jobs.items()}


def test_retry_follows_the_single_job_rule() -> None:
    jobs = one_of_each_state()
    result = bulk.retry_jobs(ALL)
    assert (result.matched, result.changed, result.skipped) == (7, 4, 3)
    assert states(jobs) == {
        "available": "available",
        "scheduled": "available",
        "retryable": "available",
        "running": "running",
        "completed": "completed",
        "failed": "available",
        "cancelled": "available",
    }
    failed = Job.all_objects.get(pk=jobs["failed"].pk)
    assert failed.finalized_at is None and failed.max_attempts >= failed.attempt + 1
    assert result.done and result.sample == sorted(
        jobs[name].pk for name in ("scheduled", "retryable", "failed", "cancelled")
    )


def test_cancel_follows_the_single_job_rule() -> None:
    jobs = one_of_each_state()
    asked = JobFactory(
        state=Job.State.RUNNING, attempt=1, locked_by="w-1", cancel_requested_at=timezone.now()
    )
    result = bulk.cancel_jobs(ALL)
    assert (result.matched, result.changed, result.cancel_requested) == (8, 4, 1)
    assert states(jobs) == {
        "available": "cancelled",
        "scheduled": "cancelled",
        "retryable": "cancelled",
        "running": "running",
        "completed": "completed",
        "failed": "failed",
        "cancelled": "cancelled",
    }
    running = Job.all_objects.get(pk=jobs["running"].pk)
    assert running.cancel_requested_at is not None
    assert Job.all_objects.get(pk=asked.pk).cancel_requested_at == asked.cancel_requested_at


def test_delete_takes_only_ended_jobs() -> None:
    jobs = one_of_each_state()
    result = bulk.delete_jobs(ALL)
    assert (result.matched, result.changed, result.skipped) == (7, 3, 4)
    left = set(Job.all_objects.values_list("state", flat=True))
    assert left == {"available", "scheduled", "retryable", "running"}
    assert not Job.all_objects.filter(pk=jobs["failed"].pk).exists()


def test_a_dry_run_counts_without_changing() -> None:
    jobs = one_of_each_state()
    before = states(jobs)
    for operation, changed in (
        (bulk.retry_jobs, 4),
        (bulk.cancel_jobs, 4),
        (bulk.delete_jobs, 3),
    ):
        result = operation(ALL, dry_run=True, batch_size=2)
        assert result.dry_run and (result.matched, result.changed) == (7, changed)
        assert len(result.sample) == changed
    assert states(jobs) == before
    assert bulk.cancel_jobs(ALL, dry_run=True).cancel_requested == 1


def test_each_batch_is_its_own_short_transaction() -> None:
    failed = JobFactory.create_batch(10, failed=True)
    transactions: list[int] = []
    seen: list[list[int]] = []

    def on_batch(changed: list[ChangedJob]) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT txid_current()")
            transactions.append(cursor.fetchone()[0])
        seen.append([job.id for job in changed])

    progress: list[tuple[int, int]] = []
    result = bulk.retry_jobs(
        JobFilter(states=("failed",)),
        batch_size=3,
        on_batch=on_batch,
        progress=lambda done: progress.append((done.matched, done.changed)),
    )
    assert result.changed == 10
    assert all(len(ids) <= 3 for ids in seen) and len(seen) >= 4
    assert sorted(id_ for ids in seen for id_ in ids) == sorted(job.pk for job in failed)
    assert len(set(transactions)) == len(seen)  # one transaction per batch
    assert progress[-1] == (10, 10) and len(progress) >= len(seen)
    assert not connection.in_atomic_block


def test_sparse_matches_are_found_across_id_ranges() -> None:
    """A batch scans a bounded id range; the walk still finds matches far apart."""
    first = JobFactory(failed=True)
    JobFactory.create_batch(30, finished=True)
    last = JobFactory(failed=True)
    result = bulk.retry_jobs(JobFilter(states=("failed",)), batch_size=1)
    assert (result.matched, result.changed) == (2, 2)
    assert result.sample == [first.pk, last.pk]


def test_a_walk_resumes_where_its_time_ran_out() -> None:
    JobFactory.create_batch(6, failed=True)
    first = bulk.retry_jobs(ALL, batch_size=2, seconds=0)
    assert (first.changed, first.done) == (2, False)
    rest = bulk.retry_jobs(ALL, batch_size=2, after=first.after, end=first.end)
    assert (rest.changed, rest.done) == (4, True)
    assert not Job.all_objects.filter(state="failed").exists()


def test_jobs_enqueued_during_a_walk_are_not_in_it() -> None:
    JobFactory.create_batch(4, failed=True)
    late: list[Job] = []

    def enqueue_more(result: bulk.BulkResult) -> None:
        if not late:
            late.append(JobFactory(failed=True))

    result = bulk.retry_jobs(ALL, batch_size=2, progress=enqueue_more)
    assert result.changed == 4
    assert Job.all_objects.get(pk=late[0].pk).state == "failed"


def test_filters() -> None:
    now = timezone.now()
    old = JobFactory(failed=True, queue="emails", created_at=now - timedelta(days=3))
    new = JobFactory(failed=True, queue="emails", task="tests.jobs.send_email")
    other = JobFactory(failed=True, queue="reports")

    def matched(selection: JobFilter) -> set[int]:
        return set(bulk.retry_jobs(selection, dry_run=True).sample)

    assert matched(JobFilter(queues=("emails",))) == {old.pk, new.pk}
    assert matched(JobFilter(tasks=("tests.jobs.send_email",))) == {new.pk}
    assert matched(JobFilter(since=now - timedelta(days=1))) == {new.pk, other.pk}
    assert matched(JobFilter(until=now - timedelta(days=1))) == {old.pk}
    assert matched(JobFilter(search="send_email")) == {new.pk}
    assert matched(JobFilter(search=str(other.pk))) == {other.pk}
    assert matched(JobFilter(ids=(old.pk, other.pk))) == {old.pk, other.pk}
    assert matched(JobFilter(ids=(old.pk,), queues=("reports",))) == set()
    with pytest.raises(ValueError, match="not a job state"):
        JobFilter(states=("nope",))
    assert JobFilter().selects_everything and not JobFilter(queues=("a",)).selects_everything
    assert JobFilter(states=("failed",), queues=("emails",)).describe() == (
        "jobs in state failed, of queue emails"
    )


def test_cancelling_a_batch_s_last_jobs_completes_the_batch() -> None:
    batch = BatchFactory(sealed=True, callback_task="tests.jobs.record", callback_args=["done"])
    JobFactory.create_batch(3, batch=batch)
    bulk.cancel_jobs(JobFilter(batch=batch.pk), batch_size=2)
    batch = Batch.objects.get(pk=batch.pk)
    assert batch.state == "complete" and batch.callback_job is not None
    callback = Job.all_objects.get(pk=batch.callback_job)
    assert callback.kwargs["counts"]["cancelled"] == 3


def test_each_queue_is_notified_once_per_batch_and_running_jobs_are_told() -> None:
    JobFactory.create_batch(3, failed=True, queue="emails")
    JobFactory(failed=True, queue="reports")
    running = JobFactory(state=Job.State.RUNNING, attempt=1, locked_by="w-1")
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        dbname=settings["NAME"],
        autocommit=True,
    ) as listener:
        listener.execute("LISTEN eddyq_jobs")
        listener.execute("LISTEN eddyq_control")
        bulk.retry_jobs(JobFilter(states=("failed",)))
        bulk.cancel_jobs(JobFilter(ids=(running.pk,)))
        heard = [(n.channel, n.payload) for n in listener.notifies(timeout=1, stop_after=4)]
    assert sorted(heard) == [
        ("eddyq_control", f"cancel:{running.pk}"),
        ("eddyq_jobs", "emails"),
        ("eddyq_jobs", "reports"),
    ]


def test_expired_jobs_are_out_of_sight() -> None:
    gone = JobFactory(failed=True, finalized_at=timezone.now() - timedelta(days=400))
    result = bulk.retry_jobs(ALL)
    assert result.matched == 0
    assert Job.all_objects.get(pk=gone.pk).state == "failed"


def test_a_bad_batch_size_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        bulk.retry_jobs(ALL, batch_size=0)


def bulk_waits_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            ["SELECT %"],
        )
        return cursor.fetchone() is not None


def test_a_batch_that_deadlocks_with_a_worker_is_done_again() -> None:
    """A worker finishes two running jobs, locking the second, then the first; the bulk cancel
    locks the first, then waits for the second: PostgreSQL breaks the deadlock by rolling the
    bulk's batch back (it waited first), and the batch is done again once the worker is done."""
    first, second = (
        JobFactory(state=Job.State.RUNNING, attempt=1, locked_by="w-1") for _ in range(2)
    )
    results: list[bulk.BulkResult | BaseException] = []

    def cancel() -> None:
        try:
            results.append(bulk.cancel_jobs(JobFilter(ids=(first.pk, second.pk))))
        except BaseException as error:
            results.append(error)
        finally:
            connection.close()

    finish = "UPDATE eddyq_jobs SET state = 'completed', finalized_at = now() WHERE id = %s"
    with db.connect() as worker, worker.transaction():
        worker.execute(finish, [second.pk])
        thread = threading.Thread(target=cancel)
        thread.start()
        wait_for(bulk_waits_for_a_lock, 10)
        worker.execute(finish, [first.pk])  # waits for the bulk's lock, until it rolls back
    thread.join(30)
    [result] = results
    assert isinstance(result, bulk.BulkResult), result
    assert (result.matched, result.changed) == (2, 0)  # finished meanwhile: nothing to cancel
    assert {job.state for job in Job.all_objects.filter(pk__in=[first.pk, second.pk])} == {
        "completed"
    }
