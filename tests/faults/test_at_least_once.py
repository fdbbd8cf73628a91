"""At least once, never lost: 5,000 jobs, three workers SIGKILLed at random and restarted.

Every job must end ``completed``, none stuck and none lost. The handlers' own record (one
Execution row per execution, written in the handler's transaction) may show a job run more than
once only if a worker died while running it: the job's ``errors`` then hold a rescue naming that
worker, one per lost attempt, and nothing else.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter

import pytest

from demo.models import Execution
from django_eddyq.models import Job
from tests.faults.conftest import (
    RESCUED,
    Fleet,
    WorkerProcess,
    count_by_state,
    current_leader,
    enqueue_recorded,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

JOBS = 5000
WORKERS = 3
CONCURRENCY = "8"
KILLS = 6


def holding_running_jobs(workers: list[WorkerProcess]) -> list[WorkerProcess]:
    """The live workers that hold running jobs: killing one interrupts work."""
    holders = set(Job.all_objects.filter(state="running").values_list("locked_by", flat=True))
    return [w for w in workers if w.alive() and set(w.worker_ids()) & holders]


def test_every_job_completes_and_only_jobs_of_killed_workers_run_again(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(8)
    ids = enqueue_recorded([rng.uniform(0.0, 0.03) for _ in range(JOBS)])
    started = time.monotonic()
    workers = [fleet.start("--concurrency", CONCURRENCY) for _ in range(WORKERS)]
    for worker in workers:
        worker.worker_id()

    killed: set[str] = set()
    leaders_killed = 0
    while len(killed) < KILLS and Job.all_objects.filter(state="available").exists():
        time.sleep(rng.uniform(0.5, 1.5))
        candidates = holding_running_jobs(workers)
        if not candidates:
            continue
        victim = rng.choice(candidates)
        victim_id = victim.worker_id()
        leaders_killed += current_leader() == victim_id
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        killed.add(victim_id)
        workers[workers.index(victim)] = fleet.start("--concurrency", CONCURRENCY)

    wait_until(
        lambda: count_by_state(ids).get("completed", 0) == JOBS, 120, f"all {JOBS} jobs to end"
    )
    took = time.monotonic() - started
    assert len(killed) >= 3, f"only {len(killed)} kills before the queue drained"

    executions = Counter(
        Execution.objects.filter(label="execution").values_list("job_id", flat=True)
    )
    assert set(executions) == set(ids), "a job never ran, or a row names no job of this test"
    rescues = rescued_jobs = re_executions = 0
    for job_id, attempt, errors, result, locked_by in Job.all_objects.filter(
        pk__in=ids
    ).values_list("id", "attempt", "errors", "result", "locked_by"):
        assert (result, locked_by) == (job_id, None)
        rescued = [entry for entry in errors if entry.get("exception_class") == RESCUED]
        assert rescued == errors, f"job {job_id} failed otherwise than by a rescue: {errors}"
        assert attempt == 1 + len(rescued)
        for entry in rescued:
            assert entry["rescued_from"] in killed, (
                f"job {job_id} was rescued from {entry['rescued_from']}, which was never killed"
            )
        assert 1 <= executions[job_id] <= 1 + len(rescued), (
            f"job {job_id} ran {executions[job_id]} times, with {len(rescued)} rescues"
        )
        rescues += len(rescued)
        rescued_jobs += bool(rescued)
        re_executions += executions[job_id] - 1
    assert rescues > 0, "the kills interrupted no job"

    with capsys.disabled():
        print(
            f"\nat-least-once: jobs={JOBS} executions={executions.total()} "
            f"re-executions={re_executions} rescues={rescues} (of {rescued_jobs} jobs) "
            f"kills={len(killed)} (of the leader: {leaders_killed}), drained in {took:.1f}s"
        )
