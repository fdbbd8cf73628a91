"""``--max-jobs``, ``--max-memory`` and ``--reload``: real worker processes replaced by fresh
ones, with bounded waits; every process is cleaned up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from demo.models import Execution
from django_eddyq.models import Job, WorkerProcess
from django_eddyq.worker import Worker, pacing
from django_eddyq.worker.recycling import Recycling, resident_mib
from tests import jobs
from tests.processes import MANAGE, StartWorker, children_of, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def log_of(tmp_path: Path, order: int = 0) -> str:
    return (tmp_path / f"worker-{order}.log").read_text()


def test_a_worker_takes_its_max_jobs_then_exits_zero(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    jobs.record.enqueue_many([(f"job-{n}",) for n in range(12)])
    process = start_worker("--max-jobs", "5", "--concurrency", "2")
    assert process.wait(60) == 0
    assert Execution.objects.count() == 5
    assert Job.objects.filter(state=Job.State.COMPLETED).count() == 5
    assert Job.objects.filter(state=Job.State.AVAILABLE).count() == 7
    log = log_of(tmp_path)
    assert "each process replaced after 5 jobs" in log
    assert "stopped to be replaced, as it has taken its 5 jobs" in log


def test_running_jobs_end_before_a_recycled_worker_exits(
    start_worker: StartWorker,
) -> None:
    # A recycled worker waits for its jobs however long they take, not the shutdown timeout.
    slow = jobs.sleep.enqueue(2.0, "slow")
    process = start_worker("--max-jobs", "1", "--shutdown-timeout", "0.2")
    assert process.wait(60) == 0
    assert Job.objects.get(pk=slow.pk).state == Job.State.COMPLETED


def test_a_recycled_worker_runs_the_jobs_it_claimed_ahead(
    fast_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Quick jobs first, so that the worker claims ahead (generously here); then slower ones,
    # which wait in its queue for a slot longer than a stopping worker would let them.
    monkeypatch.setattr(pacing, "CLAIM_AHEAD_SECONDS", 0.5)
    jobs.sleep.enqueue_many([(0.001,)] * 4)
    jobs.sleep.enqueue_many([(0.06,)] * 12)
    worker = Worker(concurrency=2, max_jobs=16, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert worker.recycled is not None
    assert worker._planner.handed_back == 0
    assert Job.objects.filter(state=Job.State.COMPLETED).count() == 16


def test_the_supervisor_replaces_each_child_that_took_its_max_jobs(
    start_worker: StartWorker,
) -> None:
    jobs.record.enqueue_many([(f"job-{n}",) for n in range(20)])
    supervisor = start_worker("--processes", "2", "--concurrency", "1", "--max-jobs", "3")
    wait_for(lambda: Job.objects.filter(state=Job.State.COMPLETED).count() == 20, seconds=60)
    # No child ran more than its three jobs; replacing them started at least seven.
    per_process = Execution.objects.values("pid").distinct()
    assert per_process.count() >= 7
    assert all(Execution.objects.filter(pid=row["pid"]).count() <= 3 for row in per_process)
    wait_for(lambda: len(children_of(supervisor.pid)) == 2)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0


def test_a_worker_over_its_max_memory_after_a_job_is_replaced(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    hoard = jobs.hoards_memory.enqueue(400)
    process = start_worker("--max-memory", "300", "--concurrency", "1")
    assert process.wait(60) == 0
    assert Job.objects.get(pk=hoard.pk).state == Job.State.COMPLETED
    log = log_of(tmp_path)
    assert "each process replaced at 300 MiB" in log
    assert "MiB (max memory 300 MiB)" in log


def test_max_memory_below_the_starting_size_is_refused(
    worker_environment: dict[str, str],
) -> None:
    result = subprocess.run(
        [sys.executable, str(MANAGE), "eddyq_worker", "--max-memory", "1"],
        env=worker_environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "--max-memory 1 is not above the worker's size as it starts" in result.stderr


def test_memory_is_looked_at_only_after_jobs_end() -> None:
    recycling = Recycling(max_memory_mib=1)
    assert resident_mib() > 1
    assert recycling.reason(finished=0) is None
    reason = recycling.reason(finished=1)
    assert reason is not None and "(max memory 1 MiB)" in reason
    # Not again within the second, however many jobs end.
    assert recycling.reason(finished=2) is None


def test_max_jobs_caps_each_claim() -> None:
    recycling = Recycling(max_jobs=5)
    assert recycling.cap(8) == 5
    recycling.taken = 4
    assert (recycling.cap(8), recycling.may_take(), recycling.reason(0)) == (1, True, None)
    recycling.taken = 5
    assert (recycling.cap(8), recycling.may_take()) == (0, False)
    assert recycling.reason(0) == "it has taken its 5 jobs (max jobs 5)"


@pytest.mark.parametrize("limits", [{"max_jobs": 0}, {"max_memory_mib": -5}])
def test_limits_below_one_are_refused(limits: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be an integer ≥ 1"):
        Recycling(**limits)


@pytest.mark.parametrize("processes", ["1", "2"])
def test_reload_restarts_the_worker_when_its_code_changes(
    worker_environment: dict[str, str], tmp_path: Path, processes: str
) -> None:
    probe = tmp_path / "reload_probe.py"
    probe.write_text('"""A module the reloader watches."""\n')
    environment = {
        **worker_environment,
        "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), *filter(None, [worker_environment.get("PYTHONPATH")])]
        ),
        "EDDYQ_TASK_MODULES": "tests.jobs,reload_probe",
    }
    with (tmp_path / "reload.log").open("wb") as log:
        parent = subprocess.Popen(
            [sys.executable, str(MANAGE), "eddyq_worker", "--reload", "--processes", processes],
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: WorkerProcess.objects.count() == int(processes), seconds=30)
        first = set(WorkerProcess.objects.values_list("id", flat=True))
        slow = jobs.sleep.enqueue(1.0, "running as the code changes")
        wait_for(lambda: Job.objects.get(pk=slow.pk).state == Job.State.RUNNING)

        # The reloader notices a newer modification time within a second or so of its start.
        def restarted() -> bool:
            later = time.time() + 1
            os.utime(probe, (later, later))
            return bool(set(WorkerProcess.objects.values_list("id", flat=True)) - first)

        wait_for(restarted, seconds=30)
        # The job running at the change was let finish, not left to the rescuer.
        assert Job.objects.get(pk=slow.pk).state == Job.State.COMPLETED
        after = jobs.record.enqueue("after the reload")
        wait_for(lambda: Job.objects.get(pk=after.pk).state == Job.State.COMPLETED)
        assert parent.poll() is None
        assert "reload_probe.py changed: restarting" in (tmp_path / "reload.log").read_text()
    finally:
        parent.send_signal(signal.SIGTERM)
        try:
            assert parent.wait(30) == 0
        finally:
            for pid in children_of(parent.pid):
                os.kill(pid, signal.SIGKILL)
            if parent.poll() is None:
                parent.kill()
