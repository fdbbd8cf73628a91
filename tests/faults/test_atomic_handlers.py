"""Exactly once: atomic handlers' writes commit with their job's completion, whatever happens to
their worker.

1,000 jobs, each writing one Execution row naming its job and then pausing, are drained by three
workers that are SIGKILLed, and SIGSTOPped past their lease, at random moments; the rescuer
retries what they held. With atomic handlers every job completes once and leaves exactly one row.
The same run with plain handlers, for contrast, leaves a second row for jobs whose worker died or
froze after the write (at least once, as documented).
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter

import pytest
from django.db import connection

from demo.models import Execution
from django_eddyq.models import Job
from tests import jobs
from tests.faults.conftest import (
    LEASE,
    RESCUED,
    Fleet,
    WorkerProcess,
    count_by_state,
    enqueue_recorded,
    wait_until,
)
from tests.faults.test_at_least_once import holding_running_jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

JOBS = 1000
WORKERS = 3
CONCURRENCY = "8"
FAULTS = 6  # half SIGKILL, half SIGSTOP
REFUSED = "what it wrote was rolled back"


def completions_counted() -> int:
    """The completions every worker counted into the activity table, each in the transaction
    that completed the job: a job completed twice would count twice."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(sum(completed), 0) FROM eddyq_activity")
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "plain"])
def test_killed_and_frozen_workers_leave_one_row_per_atomic_job(
    fleet: Fleet, capsys: pytest.CaptureFixture[str], atomic: bool
) -> None:
    rng = random.Random(21)
    task = jobs.atomic_records_then_pauses if atomic else jobs.records_then_pauses
    ids = enqueue_recorded([rng.uniform(0.05, 0.35) for _ in range(JOBS)], task)
    started = time.monotonic()
    workers = [fleet.start("--concurrency", CONCURRENCY) for _ in range(WORKERS)]
    for worker in workers:
        worker.worker_id()

    faults = ["SIGKILL", "SIGSTOP"] * (FAULTS // 2)
    rng.shuffle(faults)
    killed: set[str] = set()
    stopped: set[str] = set()
    frozen: list[tuple[WorkerProcess, float]] = []  # and when to wake it

    def wake_the_rested() -> None:
        for worker, wake_at in list(frozen):
            if time.monotonic() >= wake_at:
                worker.signal(signal.SIGCONT)
                frozen.remove((worker, wake_at))

    while faults and Job.all_objects.filter(state="available").exists():
        time.sleep(rng.uniform(0.3, 1.0))
        wake_the_rested()
        candidates = [w for w in holding_running_jobs(workers) if w not in dict(frozen)]
        if not candidates:
            continue
        victim = rng.choice(candidates)
        how = faults.pop()
        if how == "SIGKILL":
            killed.add(victim.worker_id())
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            workers[workers.index(victim)] = fleet.start("--concurrency", CONCURRENCY)
        else:
            stopped.add(victim.worker_id())
            victim.signal(signal.SIGSTOP)
            # Past its lease, and the leader's if it held it: the rescuer retries its jobs.
            frozen.append((victim, time.monotonic() + LEASE + rng.uniform(1.0, 2.0)))

    def drained() -> bool:
        # A worker frozen as it committed a completion holds that job's row, which the rescuer
        # skips, until it wakes.
        wake_the_rested()
        return count_by_state(ids).get("completed", 0) == JOBS

    wait_until(drained, 120, f"all {JOBS} jobs to end")
    took = time.monotonic() - started
    # Every handler ends before the counting: the frozen ones wake and try to commit, then
    # every worker stops, after its handlers have returned.
    for worker, _wake_at in frozen:
        worker.signal(signal.SIGCONT)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0
    assert not faults, f"{len(faults)} faults left when the queue drained"

    rows = Counter(Execution.objects.filter(label="execution").values_list("job_id", flat=True))
    assert set(rows) == set(ids), "a job left no row, or a row names no job of this test"
    rescues = Counter[str]()
    for job_id, attempt, errors, result in Job.all_objects.filter(pk__in=ids).values_list(
        "id", "attempt", "errors", "result"
    ):
        assert result == job_id
        assert all(entry.get("exception_class") == RESCUED for entry in errors), errors
        assert attempt == 1 + len(errors)
        rescues.update(entry["rescued_from"] for entry in errors)
    assert set(rescues) <= killed | stopped
    assert set(rescues) & killed, "no kill interrupted a job"
    assert set(rescues) & stopped, "no freeze outlasted a lease"
    duplicates = rows.total() - len(rows)
    refused = sum(len(w.logged("INFO", REFUSED)) for w in fleet.started)
    if atomic:
        assert duplicates == 0, f"{duplicates} jobs' rows committed more than once"
        assert completions_counted() == JOBS
    with capsys.disabled():
        print(
            f"\n{'atomic' if atomic else 'plain'} handlers: jobs={JOBS} rows={rows.total()} "
            f"duplicate rows={duplicates} rescues={rescues.total()} kills={len(killed)} "
            f"stops={len(stopped)} completions refused on waking={refused}, "
            f"drained in {took:.1f}s"
        )


def test_a_handler_frozen_past_its_lease_commits_nothing_when_it_wakes(fleet: Fleet) -> None:
    """The job was rescued and completed by another worker while its first handler was
    frozen, its row written but not committed: waking, that handler's completion is refused
    and its row rolled back."""
    [job_id] = enqueue_recorded([2.0], jobs.atomic_records_then_pauses)
    first = fleet.start("--concurrency", "1")
    first_id = first.worker_id()
    wait_until(
        lambda: Job.all_objects.filter(pk=job_id, locked_by=first_id).exists(),
        10,
        "the first worker to run the job",
    )
    time.sleep(0.5)  # its handler has written its row, and pauses
    first.signal(signal.SIGSTOP)
    second = fleet.start("--concurrency", "1")  # leads once the first's leader lease passes
    wait_until(
        lambda: Job.all_objects.filter(pk=job_id, state="completed").exists(),
        LEASE * 4 + 5,
        "the job to be rescued and completed by the second worker",
    )
    first.signal(signal.SIGCONT)
    wait_until(lambda: first.logged("INFO", REFUSED), 10, "the first handler to wake")
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0

    job = Job.all_objects.get(pk=job_id)
    assert (job.attempt, job.result, job.attempted_by) == (2, job_id, second.worker_id())
    [rescue] = job.errors
    assert (rescue["exception_class"], rescue["rescued_from"]) == (RESCUED, first_id)
    rows = Execution.objects.filter(job_id=job_id)
    assert [row.pid for row in rows] == [second.pid]
    assert not first.errors()
