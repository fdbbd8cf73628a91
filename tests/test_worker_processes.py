"""Real ``manage.py eddyq_worker`` processes: bounded waits, and every process is cleaned up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from django.db.models.functions import Now

from demo.models import Execution
from django_eddyq.maintenance import Rescuer
from django_eddyq.models import Job
from tests import jobs
from tests.processes import MANAGE, StartWorker, children_of, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def states(*created: Job) -> list[str]:
    by_id = dict(Job.objects.filter(pk__in=[j.pk for j in created]).values_list("id", "state"))
    return [by_id[j.pk] for j in created]


def test_burst_drains_and_exits_zero_even_when_jobs_fail(start_worker: StartWorker) -> None:
    done = jobs.add.enqueue(1, 2)
    failed = jobs.discard.enqueue("no")
    process = start_worker("--burst", "--concurrency", "2")
    assert process.wait(60) == 0
    assert states(done, failed) == ["completed", "failed"]


def test_two_processes_never_run_the_same_job(start_worker: StartWorker) -> None:
    jobs.sleep.enqueue_many([(0.05, f"job-{n}") for n in range(160)])
    first = start_worker("--burst", "--concurrency", "4")
    second = start_worker("--burst", "--concurrency", "4")
    assert first.wait(90) == 0
    assert second.wait(90) == 0
    labels = list(Execution.objects.values_list("label", flat=True))
    assert sorted(labels) == sorted(f"job-{n}" for n in range(160))
    assert Execution.objects.values("pid").distinct().count() == 2
    assert Job.objects.exclude(state=Job.State.COMPLETED).count() == 0


def test_sigterm_lets_jobs_finish_and_leaves_one_still_running_to_the_rescuer(
    start_worker: StartWorker,
) -> None:
    process = start_worker("--concurrency", "4", "--shutdown-timeout", "1.5")
    short = jobs.sleep.enqueue(0.5, "short")
    long = jobs.nap.enqueue(60)
    wait_for(lambda: states(short, long) == ["running", "running"])

    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0
    assert time.monotonic() - started < 5

    # Its handler was still running: the job keeps its attempt and its lease, and once the
    # lease has expired (the process long gone), the rescuer retries it.
    assert states(short, long) == ["completed", "running"]
    left = Job.objects.get(pk=long.pk)
    assert left.attempt == 1 and left.locked_by and left.locked_until
    wait_for(lambda: Job.objects.filter(pk=long.pk, locked_until__lt=Now()).exists())
    assert Rescuer().run_once() == 1
    rescued = Job.objects.get(pk=long.pk)
    assert (rescued.state, rescued.errors[0]["rescued_from"]) == ("retryable", left.locked_by)


def test_a_second_signal_exits_at_once_with_status_one(start_worker: StartWorker) -> None:
    process = start_worker("--concurrency", "1", "--shutdown-timeout", "60")
    long = jobs.nap.enqueue(60)
    wait_for(lambda: states(long) == ["running"])
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    assert process.wait(10) == 1


def test_a_stopped_worker_claims_nothing_more(start_worker: StartWorker) -> None:
    process = start_worker("--concurrency", "1", "--shutdown-timeout", "5")
    first = jobs.sleep.enqueue(0.5, "first")
    wait_for(lambda: states(first) == ["running"])
    process.send_signal(signal.SIGTERM)
    second = jobs.add.enqueue(1, 1)
    assert process.wait(20) == 0
    assert states(first, second) == ["completed", "available"]


def test_processes_supervisor_runs_children_and_restarts_one_that_dies(
    start_worker: StartWorker,
) -> None:
    supervisor = start_worker("--processes", "2", "--concurrency", "2")
    wait_for(lambda: len(children_of(supervisor.pid)) == 2)
    original = set(children_of(supervisor.pid))

    jobs.sleep.enqueue_many([(0.05, f"job-{n}") for n in range(40)])
    wait_for(lambda: Job.objects.filter(state=Job.State.COMPLETED).count() == 40)
    assert Execution.objects.values("pid").distinct().count() == 2

    victim = min(original)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(set(children_of(supervisor.pid)) - original) == 1, seconds=30)
    assert victim not in children_of(supervisor.pid)

    after = jobs.record.enqueue("after restart")
    wait_for(lambda: states(after) == ["completed"])

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0


def test_processes_in_burst_mode_exit_zero_when_drained(start_worker: StartWorker) -> None:
    created = jobs.add.enqueue_many([(n, n) for n in range(50)])
    supervisor = start_worker("--processes", "2", "--burst")
    assert supervisor.wait(60) == 0
    assert set(states(*created)) == {"completed"}
    assert children_of(supervisor.pid) == []


def test_worker_refuses_to_start_with_invalid_settings(
    worker_environment: dict[str, str],
) -> None:
    result = subprocess.run(
        [sys.executable, str(MANAGE), "eddyq_worker", "--burst"],
        env={**worker_environment, "EDDYQ_STALE_AFTER": "soon"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "STALE_AFTER" in result.stderr
    assert "soon" in result.stderr


def test_supervisor_and_workers_all_signalled_still_drain_gracefully(
    start_worker: StartWorker,
) -> None:
    """As systemd's default KillMode=control-group does: SIGTERM to every process at once."""
    supervisor = start_worker("--processes", "2", "--concurrency", "1", "--shutdown-timeout", "10")
    wait_for(lambda: len(children_of(supervisor.pid)) == 2)
    slow = jobs.sleep.enqueue_many([(1.0, "first"), (1.0, "second")])
    wait_for(lambda: states(*slow) == ["running", "running"])
    for pid in [supervisor.pid, *children_of(supervisor.pid)]:
        os.kill(pid, signal.SIGTERM)
    assert supervisor.wait(30) == 0
    assert states(*slow) == ["completed", "completed"]
