"""The worker in this process, against the real database (committed data: transaction=True)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from demo.models import Execution
from django_eddyq.handlers import default_backoff
from django_eddyq.models import Job
from django_eddyq.worker import Worker, passes
from django_eddyq.worker.pacing import (
    CLAIM_AHEAD_FACTOR,
    CLAIM_AHEAD_MAX_SECONDS,
    CLAIM_AHEAD_PASSES,
    READY_MAX_WAIT_SECONDS,
)
from django_eddyq.worker.passes import Pass, PassRunner, run_pass
from tests import jobs
from tests.conftest import FAST_SETTINGS
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]


def refreshed(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def backoff_seconds(job: Job) -> float:
    """The wait the worker set: from the failure's time to run_at, both on the database clock."""
    failed_at = datetime.fromisoformat(job.errors[-1]["at"])
    return (job.run_at - failed_at).total_seconds()


def seconds_until_run_at(job: Job) -> float:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM run_at - now()) FROM eddyq_jobs WHERE id = %s", [job.pk]
        )
        return float(cursor.fetchone()[0])


def test_burst_worker_completes_jobs_and_stores_results(run_burst_worker: RunWorker) -> None:
    added = jobs.add.enqueue(2, 3)
    echoed = jobs.echo.enqueue((1, 2), key={"a": None})
    plain = jobs.add.using(queue="other").enqueue(b=1, a=1)

    worker = run_burst_worker()

    for job, result in [
        (added, 5),
        (echoed, {"args": [[1, 2]], "kwargs": {"key": {"a": None}}}),
        (plain, 2),
    ]:
        stored = refreshed(job)
        assert stored.state == Job.State.COMPLETED
        assert stored.result == result
        assert stored.attempt == 1
        assert stored.errors == []
        assert stored.locked_by is None and stored.locked_until is None
        assert stored.attempted_at is not None and stored.finalized_at is not None
        assert stored.attempted_at <= stored.finalized_at
    assert worker.processed == 3


def test_async_handlers_run_on_the_event_loop(run_burst_worker: RunWorker) -> None:
    job = jobs.async_add.enqueue(20, 22)
    run_burst_worker()
    stored = refreshed(job)
    assert (stored.state, stored.result) == (Job.State.COMPLETED, 42)


def test_a_plain_function_is_not_a_task(run_burst_worker: RunWorker) -> None:
    job = Job.objects.create(task="tests.jobs.plain_function", args=[21], max_attempts=1)
    run_burst_worker()
    stored = refreshed(job)
    assert (stored.state, stored.result) == (Job.State.FAILED, None)
    assert "'tests.jobs.plain_function' is not a registered task" in stored.errors[0]["error"]


def test_claims_in_priority_then_run_at_order(run_burst_worker: RunWorker) -> None:
    base = jobs.record.using(run_at=timedelta(0))
    low = base.using(priority=-10).enqueue("low")
    first_default = base.enqueue("default-1")
    high = base.using(priority=50).enqueue("high")
    second_default = base.enqueue("default-2")
    Job.objects.filter(pk=first_default.pk).update(
        run_at=first_default.run_at - timedelta(seconds=1)
    )

    run_burst_worker(concurrency=1)

    order = list(Execution.objects.values_list("label", flat=True))
    assert order == ["high", "default-1", "default-2", "low"]
    assert {refreshed(j).state for j in (low, high, second_default)} == {Job.State.COMPLETED}


def test_worker_only_takes_its_queues(run_burst_worker: RunWorker) -> None:
    mine = jobs.add.using(queue="mine").enqueue(1, 1)
    theirs = jobs.add.using(queue="theirs").enqueue(1, 1)
    run_burst_worker(queues=["mine", "also-mine"])
    assert refreshed(mine).state == Job.State.COMPLETED
    assert refreshed(theirs).state == Job.State.AVAILABLE


def test_failed_attempt_is_retryable_after_the_tasks_backoff(run_burst_worker: RunWorker) -> None:
    job = jobs.always_fails.enqueue("nope")
    run_burst_worker()
    stored = refreshed(job)
    assert stored.state == Job.State.RETRYABLE
    assert stored.attempt == 1
    assert stored.finalized_at is None and stored.locked_by is None
    assert backoff_seconds(stored) == 10  # the task's backoff(1) = 10s, no jitter added
    [entry] = stored.errors
    assert entry["attempt"] == 1
    assert entry["error"] == "ValueError: nope"
    assert entry["exception_class"] == "builtins.ValueError"
    assert "Traceback" in entry["traceback"] and "raise ValueError(message)" in entry["traceback"]
    assert entry["at"]


def test_retries_until_max_attempts_then_failed(run_burst_worker: RunWorker) -> None:
    job = jobs.always_fails.enqueue("again")
    for attempt in (1, 2, 3):
        run_burst_worker()
        stored = refreshed(job)
        assert stored.attempt == attempt
        # Make the retry due now instead of waiting out the backoff.
        Job.objects.filter(pk=job.pk).update(run_at=stored.run_at - timedelta(hours=1))
    stored = refreshed(job)
    assert stored.state == Job.State.FAILED
    assert stored.finalized_at is not None
    assert [entry["attempt"] for entry in stored.errors] == [1, 2, 3]
    assert run_burst_worker().processed == 0


def test_default_backoff_is_attempt_to_the_fourth_with_jitter() -> None:
    for attempt in (1, 2, 3, 5, 10):
        samples = [default_backoff(attempt) for _ in range(200)]
        assert all(0.9 * attempt**4 <= s <= 1.1 * attempt**4 for s in samples)
        assert len(set(samples)) > 1


def test_default_backoff_is_applied_on_the_database_clock(run_burst_worker: RunWorker) -> None:
    job = jobs.default_backoff_fails.enqueue()
    Job.objects.filter(pk=job.pk).update(attempt=2)  # the next attempt is the third: 81s ±10 %
    run_burst_worker()
    assert 81 * 0.9 <= backoff_seconds(refreshed(job)) <= 81 * 1.1


def test_snooze_reschedules_and_gives_the_attempt_back(run_burst_worker: RunWorker) -> None:
    job = jobs.snooze.enqueue(120)
    run_burst_worker()
    stored = refreshed(job)
    assert stored.state == Job.State.SCHEDULED
    assert stored.attempt == 0
    assert stored.errors == []
    assert 119 < seconds_until_run_at(stored) <= 120


def test_discard_fails_now_with_one_error(run_burst_worker: RunWorker) -> None:
    job = jobs.discard.enqueue("bad input")
    run_burst_worker()
    stored = refreshed(job)
    assert stored.state == Job.State.FAILED
    assert stored.attempt == 1 < stored.max_attempts
    assert [entry["error"] for entry in stored.errors] == ["Discard: bad input"]


@pytest.mark.parametrize("task", [jobs.sleeps_past_timeout, jobs.async_sleeps_past_timeout])
def test_timeout_is_a_failed_attempt(run_burst_worker: RunWorker, task: object) -> None:
    job = task.enqueue(3)  # type: ignore[attr-defined]
    started = time.monotonic()
    run_burst_worker()
    stored = refreshed(job)
    assert time.monotonic() - started < 2.5
    assert stored.state == Job.State.RETRYABLE
    [entry] = stored.errors
    assert entry["error"].startswith("TimeoutError: task tests.jobs.")
    assert "timeout of 0.2s" in entry["error"]


def test_unknown_task_is_a_failed_attempt_naming_the_path(run_burst_worker: RunWorker) -> None:
    missing_module = Job.objects.create(task="no.such.module.task", max_attempts=1)
    missing_function = Job.objects.create(task="tests.jobs.no_such_task", max_attempts=2)
    run_burst_worker()
    first, second = refreshed(missing_module), refreshed(missing_function)
    assert first.state == Job.State.FAILED
    assert "'no.such.module.task' is not a registered task" in first.errors[0]["error"]
    assert second.state == Job.State.RETRYABLE
    assert second.errors[0]["error"].startswith(
        "TaskNotFound: 'tests.jobs.no_such_task' is not a registered task"
    )


def test_non_json_return_value_is_a_failed_attempt_naming_the_type(
    run_burst_worker: RunWorker,
) -> None:
    job = jobs.returns_object.enqueue()
    run_burst_worker()
    stored = refreshed(job)
    assert stored.state == Job.State.RETRYABLE
    assert stored.result is None
    assert (
        "the return value of tests.jobs.returns_object is an object of type object"
        in (stored.errors[0]["error"])
    )


def test_a_handler_that_breaks_its_transaction_does_not_break_the_worker(
    run_burst_worker: RunWorker,
) -> None:
    broken = jobs.breaks_its_transaction.enqueue()
    after = jobs.add.enqueue(1, 1)
    run_burst_worker(concurrency=1)
    assert refreshed(broken).state == Job.State.COMPLETED
    assert refreshed(after).result == 2


def test_burst_promotes_due_scheduled_and_retryable_jobs(run_burst_worker: RunWorker) -> None:
    scheduled = jobs.add.using(run_at=timedelta(hours=1)).enqueue(1, 1)
    retryable = jobs.add.enqueue(2, 2)
    future = jobs.add.using(run_at=timedelta(hours=1)).enqueue(3, 3)
    Job.objects.filter(pk=scheduled.pk).update(run_at=scheduled.run_at - timedelta(hours=2))
    Job.objects.filter(pk=retryable.pk).update(state=Job.State.RETRYABLE, attempt=1)
    run_burst_worker()
    assert refreshed(scheduled).state == Job.State.COMPLETED
    assert refreshed(retryable).state == Job.State.COMPLETED
    assert refreshed(future).state == Job.State.SCHEDULED


def test_heartbeat_extends_the_lease_of_running_jobs() -> None:
    with override_settings(
        EDDYQ={"HEARTBEAT_INTERVAL": "100ms", "STALE_AFTER": "30s", "POLL_INTERVAL": "50ms"}
    ):
        job = jobs.sleep.enqueue(1.2)
        worker = Worker(concurrency=1)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            deadline = time.monotonic() + 5
            while refreshed(job).state != Job.State.RUNNING and time.monotonic() < deadline:
                time.sleep(0.02)
            claimed = refreshed(job)
            assert claimed.locked_by == worker.id
            time.sleep(0.5)
            beaten = refreshed(job)
            assert beaten.heartbeat_at > claimed.heartbeat_at
            assert beaten.locked_until > claimed.locked_until
            assert beaten.state == Job.State.RUNNING
        finally:
            worker.stop()
            thread.join(10)
        assert refreshed(job).state == Job.State.COMPLETED


def test_a_late_finish_is_fenced_out_after_the_job_was_taken_away(fast_settings: None) -> None:
    job = jobs.sleep.enqueue(0.6, "late")
    worker = Worker(concurrency=1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while refreshed(job).state != Job.State.RUNNING and time.monotonic() < deadline:
            time.sleep(0.02)
        # What a rescuer does when a lease has expired: the job is not this worker's any more.
        Job.objects.filter(pk=job.pk).update(
            state=Job.State.RETRYABLE,
            locked_by=None,
            locked_until=None,
            run_at=job.run_at + timedelta(hours=1),
        )
        time.sleep(1.0)
    finally:
        worker.stop()
        thread.join(10)
    stored = refreshed(job)
    assert stored.state == Job.State.RETRYABLE
    assert stored.result is None and stored.finalized_at is None
    assert Execution.objects.filter(label="late").count() == 1  # the handler did run


def test_the_same_worker_reclaiming_a_job_fences_its_old_attempt(fast_settings: None) -> None:
    """A finish is fenced on the attempt too, not only on the worker id."""
    job = jobs.add.enqueue(1, 2)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE eddyq_jobs SET state = 'running', attempt = 2, locked_by = 'w' WHERE id = %s",
            [job.pk],
        )
    from django_eddyq import db, sql

    with db.connect() as conn:
        rows = conn.execute(
            sql.FINISH_JOBS,
            {
                "worker_id": "w",
                "outcomes": json.dumps([{"id": job.pk, "attempt": 1, "state": "completed"}]),
            },
        ).fetchall()
    assert rows == []
    assert refreshed(job).state == Job.State.RUNNING


def test_concurrent_claimers_never_take_the_same_job(fast_settings: None) -> None:
    created = jobs.record.enqueue_many([(f"job-{n}",) for n in range(300)])
    workers = [Worker(burst=True, concurrency=3) for _ in range(4)]
    threads = [threading.Thread(target=w.run) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    labels = list(Execution.objects.values_list("label", flat=True))
    assert sorted(labels) == sorted(f"job-{n}" for n in range(300))
    assert (
        Job.objects.filter(pk__in=[j.pk for j in created], state=Job.State.COMPLETED).count() == 300
    )
    assert sum(w.processed for w in workers) == 300
    assert sum(1 for w in workers if w.processed) >= 2


def test_stop_leaves_a_started_handler_s_job_to_the_rescuer(
    fast_settings: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A job whose sync handler still runs at the shutdown deadline is not handed back: it could
    start elsewhere while its handler runs on here, and a job that always overruns would never
    spend its attempts. It stays running under its lease, for the rescuer."""
    quick = jobs.add.enqueue(1, 1)
    slow = jobs.nap.enqueue(3)
    worker = Worker(concurrency=2, shutdown_timeout=0.3)
    thread = threading.Thread(target=worker.run)
    thread.start()

    def slow_started() -> bool:
        # Its handler has begun, not just its claim committed: a job claimed as the stop
        # comes goes back without starting.
        running = worker._slots.running.get(slow.pk)
        return running is not None and running.started_at is not None

    wait_for(lambda: slow_started() and refreshed(quick).state == Job.State.COMPLETED, seconds=5)
    worker.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert refreshed(quick).state == Job.State.COMPLETED
    stored = refreshed(slow)
    assert (stored.state, stored.attempt, stored.locked_by) == (Job.State.RUNNING, 1, worker.id)
    assert stored.errors == []
    assert worker.abandoned == [slow.pk]
    assert f"eddyq job {slow.pk} (tests.jobs.nap) still runs" in caplog.text


def test_a_starting_worker_rescues_stale_jobs_first(run_burst_worker: RunWorker) -> None:
    job = jobs.add.enqueue(1, 2)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE eddyq_jobs SET state = 'running', attempt = 1, locked_by = 'gone:1:x', "
            "locked_until = now() - interval '1 second' WHERE id = %s",
            [job.pk],
        )
    run_burst_worker()
    stored = refreshed(job)
    assert stored.state == Job.State.RETRYABLE
    assert stored.errors[0]["rescued_from"] == "gone:1:x"


def test_a_burst_worker_runs_what_its_start_up_rescue_makes_due(
    run_burst_worker: RunWorker,
) -> None:
    """The start-up rescue runs beside the first claim, not before it: a burst worker waits for
    it, and runs a job it made due at once (no back-off) before it exits."""
    job = jobs.record_execution.enqueue(0)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE eddyq_jobs SET state = 'running', attempt = 1, locked_by = 'gone:1:x', "
            "locked_until = now() - interval '1 second' WHERE id = %s",
            [job.pk],
        )
    worker = run_burst_worker()
    stored = refreshed(job)
    assert stored.state == Job.State.COMPLETED
    assert stored.attempt == 2
    assert stored.errors[0]["rescued_from"] == "gone:1:x"
    assert worker.finished == 1


def test_stale_recovery_at_start_can_be_switched_off(run_burst_worker: RunWorker) -> None:
    job = jobs.add.enqueue(1, 2)
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, attempt=1, locked_by="gone:1:x")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE eddyq_jobs SET locked_until = now() - interval '1 second'")
    with override_settings(EDDYQ={**FAST_SETTINGS, "RECOVER_STALE_ON_START": False}):
        run_burst_worker()
    assert refreshed(job).state == Job.State.RUNNING


def test_a_broken_backoff_falls_back_to_the_default(run_burst_worker: RunWorker) -> None:
    job = jobs.fails_with_broken_backoff.enqueue()
    run_burst_worker()
    stored = refreshed(job)
    assert stored.state == Job.State.RETRYABLE
    assert stored.errors[0]["error"] == "ValueError: first failure"
    assert 0.9 <= backoff_seconds(stored) <= 1.1  # attempt 1: 1s ±10 %


@pytest.mark.parametrize("task", [jobs.raises_base_exception, jobs.async_raises_base_exception])
def test_a_base_exception_is_a_failed_attempt_not_a_dead_thread(
    run_burst_worker: RunWorker, task: object
) -> None:
    job = task.enqueue()  # type: ignore[attr-defined]
    after = jobs.add.enqueue(2, 2)
    run_burst_worker(concurrency=1)
    stored = refreshed(job)
    assert stored.state == Job.State.RETRYABLE
    assert stored.errors[0]["error"].startswith("Escape: out of the")
    assert refreshed(after).result == 4


def test_a_row_naming_a_module_imports_nothing(run_burst_worker: RunWorker) -> None:
    broken = Job.objects.create(task="tests.broken_tasks.anything", max_attempts=1)
    after = jobs.add.enqueue(1, 1)
    run_burst_worker(concurrency=1)
    stored = refreshed(broken)
    assert stored.state == Job.State.FAILED
    assert "'tests.broken_tasks.anything' is not a registered task" in stored.errors[0]["error"]
    assert stored.errors[0]["worker"]
    assert "tests.broken_tasks" not in sys.modules
    assert refreshed(after).state == Job.State.COMPLETED


def test_claims_ahead_only_while_its_jobs_finish_quickly() -> None:
    worker = Worker(concurrency=4)
    assert worker._pacing.room() == 4  # nothing has finished yet: no pace to go by
    worker._pacing.run_seconds = 0.0005
    assert worker._pacing.room() == 4 * (1 + CLAIM_AHEAD_FACTOR)
    # Jobs of 10 ms: four slots finish one every 2.5 ms, 8 of them within CLAIM_AHEAD_SECONDS.
    worker._pacing.run_seconds = 0.01
    assert worker._pacing.room() == 4 + 8
    worker._pacing.run_seconds = 1.0
    assert worker._pacing.room() == 4


def test_claims_far_enough_ahead_to_outlast_its_passes() -> None:
    """When passes take longer than CLAIM_AHEAD_SECONDS (a busy or distant server), the jobs
    claimed ahead last for CLAIM_AHEAD_PASSES of them, so that slots do not run dry while the
    next pass is under way."""
    pacing = Worker(concurrency=4)._pacing
    pacing.run_seconds = 0.01  # four slots finish one every 2.5 ms
    pacing.claimed(12, 12, took=0.002)
    assert pacing.room() == 4 + 8 - 12  # quick passes: CLAIM_AHEAD_SECONDS sets the bound
    pacing.held = 0
    for _ in range(50):
        pacing.claimed(1, 0, took=0.05)
    assert pacing.pass_seconds == pytest.approx(0.05, rel=0.01)
    ahead = int(4 * CLAIM_AHEAD_PASSES * pacing.pass_seconds / 0.01)
    assert pacing.room() == 4 + ahead > 4 + 8
    pacing.claimed(0, 0, took=5.0)  # a pass that did not claim says nothing of the claims'
    assert pacing.room() == 4 + ahead
    for _ in range(50):
        pacing.claimed(1, 0, took=5.0)  # a stalled server: no more than the cap
    assert pacing.room() == 4 + int(4 * CLAIM_AHEAD_MAX_SECONDS / 0.01)


@pytest.mark.parametrize("probe", [jobs.overlap_probe, jobs.async_overlap_probe])
def test_jobs_claimed_ahead_never_run_more_handlers_than_the_concurrency(
    run_burst_worker: RunWorker, monkeypatch: pytest.MonkeyPatch, probe: Any
) -> None:
    claimed: list[int] = []
    run_pass = PassRunner.run

    def counted_pass(self: PassRunner, planned: Pass) -> Pass:
        done = run_pass(self, planned)
        claimed.append(len(done.claimed))
        return done

    monkeypatch.setattr(PassRunner, "run", counted_pass)
    monkeypatch.setattr(jobs.Overlap, "most", 0)
    probe.enqueue_many([(0.002,)] * 60)

    run_burst_worker(concurrency=3)

    assert Job.objects.filter(state=Job.State.COMPLETED).count() == 60
    assert max(claimed) > 3, claimed  # it did claim ahead
    assert jobs.Overlap.most == 3


@contextmanager
def worker_claiming_ahead(**options: Any) -> Iterator[Worker]:
    """A one-slot worker running in a thread, told its jobs have gone quickly so far, so that it
    claims three jobs ahead; stopped and joined at the end."""
    worker = Worker(concurrency=1, maintenance=False, **options)
    worker._pacing.run_seconds = 0.0001
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()


def all_available(waiting: list[Job]) -> bool:
    return {refreshed(job).state for job in waiting} == {Job.State.AVAILABLE}


def four_claimed() -> bool:
    return Job.objects.filter(state=Job.State.RUNNING).count() == 4


def test_stop_hands_back_the_jobs_claimed_ahead_at_once(fast_settings: None) -> None:
    running = jobs.nap.enqueue(5)
    waiting = [jobs.record.enqueue(f"waiting-{n}") for n in range(3)]
    with worker_claiming_ahead(shutdown_timeout=5) as worker:
        wait_for(four_claimed, seconds=5)
        worker.stop()
        # Long before the running job's shutdown timeout, the others are available again.
        wait_for(lambda: all_available(waiting), seconds=2)
        assert refreshed(running).state == Job.State.RUNNING
    assert not Execution.objects.exists()
    assert all(refreshed(job).attempt == 0 for job in waiting)


def test_a_job_cancelled_before_it_started_never_runs(fast_settings: None) -> None:
    jobs.nap.enqueue(1)
    cancelled = jobs.record.enqueue("cancelled")
    with worker_claiming_ahead():
        wait_for(lambda: refreshed(cancelled).state == Job.State.RUNNING, seconds=5)
        refreshed(cancelled).cancel()
        wait_for(lambda: refreshed(cancelled).state == Job.State.CANCELLED, seconds=5)
    assert not Execution.objects.filter(label="cancelled").exists()


def test_a_job_claimed_ahead_that_waits_too_long_goes_back_to_the_queue(
    fast_settings: None,
) -> None:
    """Long jobs took every slot after a quick pace let the worker claim ahead: the jobs it
    claimed ahead are not kept from other workers for longer than READY_MAX_WAIT_SECONDS."""
    long_job = jobs.nap.enqueue(READY_MAX_WAIT_SECONDS + 2)
    waiting = [jobs.record.enqueue(f"waiting-{n}") for n in range(3)]
    with worker_claiming_ahead():
        wait_for(four_claimed, seconds=5)
        claimed_at = time.monotonic()
        wait_for(lambda: all_available(waiting), seconds=READY_MAX_WAIT_SECONDS + 2)
        assert time.monotonic() - claimed_at < READY_MAX_WAIT_SECONDS + 0.5
        assert refreshed(long_job).state == Job.State.RUNNING
        assert all(refreshed(job).attempt == 0 for job in waiting)
        # It claims no more ahead while the long job holds its slot: nothing to wait for, so
        # a while of nothing happening is the check.
        time.sleep(0.5)
        assert all_available(waiting)


def test_jobs_claimed_by_a_pass_whose_reply_was_lost_go_back_unspent(
    fast_settings: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A pass can commit and its connection break before its results arrive: the worker never
    learns which jobs it claimed. Once it has reconnected, it hands back every job running
    under its id that it does not run, the attempt given back, rather than leave them to the
    rescuer, which would spend that attempt (a Django task's only one)."""
    lost = [jobs.add.using(max_attempts=1).enqueue(n, n) for n in range(3)]
    worker = Worker(concurrency=4, burst=True, maintenance=False)
    connect = passes.connect
    connections_made: list[Any] = []

    def connect_and_lose_the_first_reply() -> Any:
        made = connect()
        if not connections_made:
            # This worker's claim commits, and its connection breaks before the reply.
            run_pass(
                made,
                Pass(outcomes=[], renew=[], promote=False, claim=3, touch=[]),
                worker_id=worker.id,
                lease_seconds=60.0,
                queues=None,
            )
            made.close()
        connections_made.append(made)
        return made

    monkeypatch.setattr(passes, "connect", connect_and_lose_the_first_reply)
    worker.run()
    assert len(connections_made) == 2  # it reconnected
    for job in lost:
        stored = refreshed(job)
        assert (stored.state, stored.attempt, stored.errors) == (Job.State.COMPLETED, 1, [])
        assert f"job {job.pk} was claimed by a pass whose reply was lost" in caplog.text


def test_a_handler_whose_lease_was_lost_is_asked_to_stop(fast_settings: None) -> None:
    job = jobs.fails_when_cancelled.enqueue()
    worker = Worker(concurrency=1, burst=True, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(
            lambda: bool(worker._slots.running) and refreshed(job).state == Job.State.RUNNING, 5
        )
        # Rescued meanwhile (its lease expired): the job is not this worker's any more.
        Job.objects.filter(pk=job.pk).update(
            state=Job.State.RETRYABLE, locked_by=None, locked_until=None
        )
        running = worker._slots.running[job.pk]
        # At the next heartbeat, its handler sees cancel_requested() and stops, freeing its
        # slot: the burst worker ends well before the handler's 30 seconds.
        thread.join(5)
        assert not thread.is_alive()
        assert running.cancel.requested
    finally:
        worker.stop()
        thread.join(10)
    assert refreshed(job).state == Job.State.RETRYABLE  # its late outcome was not written
