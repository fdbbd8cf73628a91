"""Batches (callbacks exactly once) and unique jobs (one row under concurrent enqueues)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction

import django_eddyq
from django_eddyq import db, sql, task
from django_eddyq.models import Batch, Job
from django_eddyq.operations import complete_batches
from django_eddyq.worker import Worker
from tests import jobs

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]


def callbacks_of(batch: Batch) -> list[Job]:
    return list(Job.all_objects.filter(metadata__batch_callback=batch.pk))


# Batches.


def test_jobs_enqueued_in_the_block_join_the_batch_and_the_callback_runs_once(
    run_burst_worker: RunWorker,
) -> None:
    with django_eddyq.batch(on_complete=jobs.echo, args=("report",), kwargs={"to": "ops"}) as b:
        added = jobs.add.enqueue_many([(1, 1), (2, 2)])
        failing = jobs.discard.enqueue("bad row")
        assert b.state == Batch.State.PENDING
    outside = jobs.add.enqueue(3, 3)
    assert {job.batch_id for job in [*added, failing]} == {b.pk}
    assert outside.batch_id is None

    run_burst_worker()

    b.refresh_from_db()
    assert b.state == Batch.State.COMPLETE
    assert b.finalized_at is not None
    [callback] = callbacks_of(b)
    assert b.callback_job == callback.pk
    assert callback.state == Job.State.COMPLETED
    assert callback.result == {
        "args": ["report"],
        "kwargs": {
            "to": "ops",
            "batch_id": b.pk,
            "counts": {"completed": 2, "failed": 1, "cancelled": 0},
        },
    }


def test_an_empty_batch_completes_at_exit() -> None:
    with django_eddyq.batch(on_complete=jobs.echo) as b:
        pass
    assert b.state == Batch.State.COMPLETE
    [callback] = callbacks_of(b)
    assert callback.kwargs["counts"] == {"completed": 0, "failed": 0, "cancelled": 0}


def test_a_batch_without_a_callback_still_completes(run_burst_worker: RunWorker) -> None:
    with django_eddyq.batch() as b:
        jobs.add.enqueue(1, 2)
    run_burst_worker()
    b.refresh_from_db()
    assert b.state == Batch.State.COMPLETE
    assert b.callback_job is None


def test_the_callback_cannot_fire_while_jobs_are_being_added(run_burst_worker: RunWorker) -> None:
    with django_eddyq.batch(on_complete=jobs.echo) as b:
        jobs.add.enqueue(1, 2)
        run_burst_worker()  # the first job ends while the block is still open
        assert Batch.objects.get(pk=b.pk).state == Batch.State.PENDING
        jobs.add.enqueue(3, 4)
    assert Batch.objects.get(pk=b.pk).state == Batch.State.PENDING
    run_burst_worker()
    assert Batch.objects.get(pk=b.pk).state == Batch.State.COMPLETE
    assert len(callbacks_of(b)) == 1


def test_a_rolled_back_batch_vanishes_with_its_jobs() -> None:
    def enqueue_then_fail() -> None:
        with transaction.atomic(), django_eddyq.batch(on_complete=jobs.echo):
            jobs.add.enqueue(1, 2)
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    assert not Batch.objects.exists()
    assert not Job.all_objects.exists()


def test_cancelling_the_last_job_completes_the_batch() -> None:
    with django_eddyq.batch(on_complete=jobs.echo) as b:
        job = jobs.add.using(run_at=timedelta(hours=1)).enqueue(1, 2)
    job.cancel()
    b.refresh_from_db()
    assert b.state == Batch.State.COMPLETE
    assert callbacks_of(b)[0].kwargs["counts"] == {"completed": 0, "failed": 0, "cancelled": 1}


def test_batch_jobs_finishing_at_the_same_instant_fire_the_callback_once() -> None:
    """Two workers end the batch's last two jobs in concurrent transactions (two workers, not
    one: a worker's passes, which count into its own activity row, never overlap)."""
    with django_eddyq.batch(on_complete=jobs.echo) as b:
        first, second = jobs.add.enqueue_many([(1, 1), (2, 2)])
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE eddyq_jobs SET state = 'running', attempt = 1, locked_by = 'w' || id "
            "WHERE batch_id = %s",
            [b.pk],
        )
    finished_jobs = threading.Barrier(2)
    completed: list[list[int]] = []

    def finish(job: Job) -> None:
        with db.connect() as conn, conn.transaction(), conn.cursor() as cursor:
            cursor.execute(
                sql.FINISH_JOBS,
                {
                    "worker_id": f"w{job.pk}",
                    "outcomes": json.dumps([{"id": job.pk, "attempt": 1, "state": "completed"}]),
                },
            )
            finished_jobs.wait()  # both jobs are finished, neither committed
            completed.append(complete_batches(cursor, [b.pk]))

    threads = [threading.Thread(target=finish, args=(job,)) for job in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(completed) == [[], [b.pk]]
    assert len(callbacks_of(b)) == 1


def test_a_batch_callback_from_a_path() -> None:
    with django_eddyq.batch(on_complete="tests.jobs.echo") as b:
        pass
    assert callbacks_of(b)[0].task == "tests.jobs.echo"


# Unique jobs.


@task(unique_for="1h")
def refresh_feed(feed_id: int) -> int:
    return feed_id


def test_a_unique_job_is_returned_instead_of_a_duplicate() -> None:
    first = refresh_feed.enqueue(1)
    again = refresh_feed.enqueue(1)
    other = refresh_feed.enqueue(2)
    elsewhere = refresh_feed.using(queue="other").enqueue(1)
    assert again.pk == first.pk
    assert len({first.pk, other.pk, elsewhere.pk}) == 3
    assert Job.all_objects.count() == 3


def test_completed_within_the_window_blocks_after_it_does_not() -> None:
    first = refresh_feed.enqueue(1)
    Job.all_objects.filter(pk=first.pk).update(state="completed")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE eddyq_jobs SET finalized_at = now() - interval '59 minutes'")
    assert refresh_feed.enqueue(1).pk == first.pk
    with connection.cursor() as cursor:
        cursor.execute("UPDATE eddyq_jobs SET finalized_at = now() - interval '61 minutes'")
    assert refresh_feed.enqueue(1).pk != first.pk


@pytest.mark.parametrize("state", ["failed", "cancelled"])
def test_failed_and_cancelled_jobs_do_not_block(state: str) -> None:
    first = refresh_feed.enqueue(1)
    Job.all_objects.filter(pk=first.pk).update(state=state)
    assert refresh_feed.enqueue(1).pk != first.pk


def test_an_explicit_unique_key_is_scoped_to_the_task() -> None:
    first = jobs.add.using(unique_key="nightly").enqueue(1, 2)
    assert jobs.add.using(unique_key="nightly").enqueue(5, 6).pk == first.pk
    assert jobs.echo.using(unique_key="nightly").enqueue().pk != first.pk
    # Without unique_for, a completed job no longer blocks its key.
    Job.all_objects.filter(pk=first.pk).update(state="completed")
    assert jobs.add.using(unique_key="nightly").enqueue(1, 2).pk != first.pk


def test_enqueue_many_honours_uniqueness() -> None:
    existing = refresh_feed.enqueue(1)
    created = refresh_feed.enqueue_many([(1,), (2,), (2,), (3,)])
    assert created[0].pk == existing.pk
    assert created[1].pk == created[2].pk
    assert Job.all_objects.count() == 3


def test_concurrent_unique_enqueues_make_one_row() -> None:
    barrier = threading.Barrier(8)
    ids: list[int] = []

    def enqueue() -> None:
        barrier.wait()
        with transaction.atomic():
            ids.append(refresh_feed.enqueue(42).pk)
        connection.close()

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(ids) == 8
    assert len(set(ids)) == 1
    assert Job.all_objects.filter(task=refresh_feed.path).count() == 1


def test_the_database_refuses_a_duplicate_key_written_by_hand() -> None:
    refresh_feed.enqueue(1)
    key = Job.all_objects.get().unique_key
    with pytest.raises(psycopg.errors.UniqueViolation), db.connect() as conn:
        conn.execute(
            "INSERT INTO eddyq_jobs (task, args, kwargs, queue, priority, state, attempt, "
            "max_attempts, run_at, created_at, errors, metadata, unique_key) VALUES "
            "('x', '[]', '{}', 'default', 0, 'available', 0, 1, now(), now(), '[]', '{}', %s)",
            [key],
        )
