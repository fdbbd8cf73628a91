"""Handlers that misbehave: they never return, kill their process, break their database
transaction or return what JSON cannot hold. Each fails its own job, clearly, and nothing more.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from django.db import transaction

from demo.models import Execution
from django_eddyq.models import Job
from tests import jobs
from tests.faults.conftest import RESCUED, Fleet, count_by_state, enqueue_recorded, wait_until
from tests.processes import children_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def job(job_id: int) -> Job:
    return Job.all_objects.get(pk=job_id)


def test_a_handler_that_never_returns_is_bounded_by_its_timeout(fleet: Fleet) -> None:
    worker = fleet.start("--concurrency", "2", "--shutdown-timeout", "5")
    stuck = jobs.never_returns.enqueue().pk
    wait_until(lambda: job(stuck).state == "failed", 10, "the stuck job to time out")
    ended = job(stuck)
    [entry] = ended.errors
    assert entry["error"].startswith("TimeoutError: task tests.jobs.never_returns ran longer")
    assert "0.3s" in entry["error"]
    assert ended.finalized_at is not None and ended.attempted_at is not None
    assert (ended.finalized_at - ended.attempted_at).total_seconds() < 0.3 + 0.5

    # Its thread is still blocked, and keeps its slot; the other slot works on.
    later = enqueue_recorded([0.0] * 5)
    wait_until(lambda: count_by_state(later) == {"completed": 5}, 10, "the later jobs")

    # Nor does the blocked thread hold up a graceful stop.
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0
    assert time.monotonic() - signalled < 2.0


def test_processes_recycles_a_worker_process_whose_threads_are_stuck(fleet: Fleet) -> None:
    """Every thread of both worker processes is stuck past its timeout: new jobs must still
    run, because the supervisor replaces a worker process that has no thread left to run jobs."""
    supervisor = fleet.start("--processes", "2", "--concurrency", "1")
    wait_until(lambda: len(supervisor.worker_ids()) == 2, 30, "both worker processes")
    first_children = set(children_of(supervisor.pid))
    stuck = [job.pk for job in jobs.never_returns.enqueue_many([(), ()])]
    wait_until(lambda: count_by_state(stuck) == {"failed": 2}, 10, "both to time out")

    after = enqueue_recorded([0.0])
    wait_until(
        lambda: count_by_state(after) == {"completed": 1},
        15,
        "a job enqueued once every thread was stuck to run (in a recycled worker process)",
    )
    assert set(children_of(supervisor.pid)) != first_children


@pytest.mark.parametrize(
    ("crash", "exit_code"),
    [
        (lambda: jobs.exits_process.enqueue(3, after=1.0), 3),
        (lambda: jobs.segfaults.enqueue(after=1.0), -signal.SIGSEGV),
    ],
    ids=["os._exit", "segfault"],
)
def test_a_handler_that_kills_its_process_takes_down_only_that_process(
    fleet: Fleet, crash: Any, exit_code: int
) -> None:
    supervisor = fleet.start("--processes", "2", "--concurrency", "2")
    wait_until(lambda: len(supervisor.worker_ids()) == 2, 30, "both worker processes")
    children = set(children_of(supervisor.pid))
    assert len(children) == 2

    # Four jobs for four slots, two per process: one process gets the crash and a sleeper.
    with transaction.atomic():
        sleepers = enqueue_recorded([3.0, 3.0, 3.0])
        crasher = crash().pk
    everything = [*sleepers, crasher]
    wait_until(lambda: count_by_state(everything) == {"running": 4}, 10, "all four to run")
    holders = dict(Job.all_objects.filter(pk__in=everything).values_list("id", "locked_by"))
    doomed = holders[crasher]
    doomed_pid = int(doomed.split(":")[1])
    [doomed_sleeper] = [s for s in sleepers if holders[s] == doomed]
    survivors = [s for s in sleepers if holders[s] != doomed]
    [survivor_pid] = children - {doomed_pid}

    wait_until(lambda: doomed_pid not in children_of(supervisor.pid), 10, "the crash")
    assert f"died (exit code {exit_code})" in supervisor.text()
    wait_until(lambda: count_by_state(sleepers) == {"completed": 3}, 20, "the sleepers to end")

    assert supervisor.alive()
    assert survivor_pid in children_of(supervisor.pid), "the other worker process was affected"
    assert len(children_of(supervisor.pid)) == 2, "the crashed worker process was not replaced"
    # The crasher's job: rescued when its lease ran out, out of attempts, failed.
    ended = job(crasher)
    assert ended.state == "failed"
    assert [(e["exception_class"], e["rescued_from"]) for e in ended.errors] == [(RESCUED, doomed)]
    # The crashed process's other job: rescued, then completed by another process.
    rescued = job(doomed_sleeper)
    assert [(e["exception_class"], e["rescued_from"]) for e in rescued.errors] == [
        (RESCUED, doomed)
    ]
    assert rescued.attempt == 2
    ran_on = set(Execution.objects.filter(job_id=doomed_sleeper).values_list("pid", flat=True))
    assert ran_on and doomed_pid not in ran_on
    # The other process's jobs never noticed.
    for survivor in survivors:
        assert (job(survivor).attempt, job(survivor).errors) == (1, [])


def test_misbehaving_handlers_fail_alone_and_the_worker_carries_on(fleet: Fleet) -> None:
    """One thread runs every job in turn, so each job gets the connection the previous one
    left behind: out of autocommit in an aborted transaction, aborted inside atomic(),
    terminated by the server."""
    with transaction.atomic():
        order = [
            jobs.leaves_its_transaction_broken.enqueue().pk,
            *enqueue_recorded([0.0]),
            jobs.fails_inside_atomic.enqueue().pk,
            *enqueue_recorded([0.0]),
            jobs.kills_its_connection.enqueue().pk,
            *enqueue_recorded([0.0]),
            jobs.breaks_its_transaction.enqueue().pk,
            *enqueue_recorded([0.0]),
            jobs.returns_object.using(max_attempts=1).enqueue().pk,
            *enqueue_recorded([0.0]),
        ]
    worker = fleet.start("--concurrency", "1")
    wait_until(
        lambda: set(count_by_state(order)) <= {"completed", "failed"}, 30, "every job to end"
    )
    broken, good1, atomic, good2, killer, good3, swallowed, good4, non_json, good5 = order
    for good in (good1, good2, good3, good4, good5):
        assert (job(good).state, job(good).result) == ("completed", good)
        assert Execution.objects.filter(job_id=good).count() == 1
    # Returned normally: completed; what they left behind is cleaned up before the next job.
    assert job(broken).state == "completed"
    assert (job(swallowed).state, job(swallowed).result) == ("completed", "survived")

    [atomic_error] = job(atomic).errors
    assert job(atomic).state == "failed"
    assert atomic_error["error"].split(":")[0] in ("InternalError", "TransactionManagementError")
    assert not Execution.objects.filter(label="inside a broken atomic").exists()

    [killed_error] = job(killer).errors
    assert job(killer).state == "failed"
    assert killed_error["error"].startswith("OperationalError")

    [non_json_error] = job(non_json).errors
    assert job(non_json).state == "failed"
    assert non_json_error["error"] == (
        "TypeError: the return value of tests.jobs.returns_object is an object of type object, "
        "which cannot be stored as JSON"
    )
    assert worker.alive()
    # The jobs' last failures are ERRORs; nothing else is.
    failed_for_good = {f"eddyq job {failed} " for failed in (atomic, killer, non_json)}
    assert sorted(error.split("(")[0] for error in worker.errors()) == sorted(failed_for_good)
