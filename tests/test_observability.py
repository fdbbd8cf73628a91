"""What a worker tells: its banner and lines on stdout, its log records, its signals, and the
registry of workers (real worker processes where it crosses processes)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.dispatch import Signal

from django_eddyq import lifecycle, signals
from django_eddyq.models import Job, WorkerProcess
from django_eddyq.worker import Worker
from tests import jobs
from tests.processes import MANAGE, StartWorker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]


@pytest.fixture
def heard() -> Iterator[Callable[[Signal], list[dict[str, Any]]]]:
    """``heard(signal)``: the keyword arguments of every sending of ``signal`` from now on."""
    connected: list[tuple[Signal, Callable[..., None]]] = []

    def listen(which: Signal) -> list[dict[str, Any]]:
        calls: list[dict[str, Any]] = []

        def receiver(sender: Any, **kwargs: Any) -> None:
            calls.append({"sender": sender, **kwargs})

        which.connect(receiver, weak=False)
        connected.append((which, receiver))
        return calls

    yield listen
    for which, receiver in connected:
        which.disconnect(receiver)


def test_every_outcome_sends_job_finished(
    run_burst_worker: RunWorker, heard: Callable[[Signal], list[dict[str, Any]]]
) -> None:
    enqueued, started, finished = (
        heard(signals.job_enqueued),
        heard(signals.job_started),
        heard(signals.job_finished),
    )
    expected = {
        jobs.add.enqueue(1, 2).pk: "completed",
        jobs.always_fails.enqueue("again").pk: "retried",
        jobs.snooze.enqueue(60).pk: "snoozed",
        jobs.always_fails.using(max_attempts=1).enqueue("last").pk: "failed",
        jobs.discard.enqueue("no use").pk: "discarded",
    }
    many = jobs.add.enqueue_many([(n, n) for n in range(3)])
    worker = run_burst_worker()
    assert [len(call["jobs"]) for call in enqueued] == [1, 1, 1, 1, 1, 3]
    assert all(call["sender"] is Job for call in enqueued)
    assert {call["job"].id for call in started} == {*expected, *(job.pk for job in many)}
    outcomes = {call["job"].id: call["outcome"] for call in finished}
    assert outcomes == {**expected, **{job.pk: "completed" for job in many}}
    for call in finished:
        assert call["sender"] is Worker and call["worker_id"] == worker.id
        assert call["duration"] is not None and call["duration"] >= 0
        failed = call["outcome"] in ("retried", "failed", "discarded", "snoozed")
        assert (call["exception"] is not None) is failed


def test_a_receiver_that_raises_changes_no_outcome(
    run_burst_worker: RunWorker, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("a broken receiver")

    for which in (signals.job_enqueued, signals.job_started, signals.job_finished):
        which.connect(broken)
    try:
        job = jobs.add.enqueue(2, 3)
        run_burst_worker()
    finally:
        for which in (signals.job_enqueued, signals.job_started, signals.job_finished):
            which.disconnect(broken)
    stored = Job.objects.get(pk=job.pk)
    assert (stored.state, stored.result) == ("completed", 5)
    receiver_errors = [r for r in caplog.records if "a receiver of a signal raised" in r.message]
    assert len(receiver_errors) == 3 and all(r.exc_info for r in receiver_errors)


def test_worker_and_leader_signals(
    fast_settings: None, heard: Callable[[Signal], list[dict[str, Any]]]
) -> None:
    started, stopping = heard(signals.worker_started), heard(signals.worker_stopping)
    elected, resigned = heard(signals.leader_elected), heard(signals.leader_resigned)
    worker = Worker(burst=True)
    worker.run()
    assert [call["worker"] for call in started] == [worker]
    assert [call["worker"] for call in stopping] == [worker]
    assert [call["worker_id"] for call in elected] == [worker.id]
    assert [(call["worker_id"], call["reason"]) for call in resigned] == [(worker.id, "it stopped")]


def test_a_last_failure_is_an_error_with_its_traceback(
    run_burst_worker: RunWorker, caplog: pytest.LogCaptureFixture
) -> None:
    retried = jobs.always_fails.enqueue("once more")
    last = jobs.always_fails.using(max_attempts=1).enqueue("for good")
    worker = run_burst_worker()
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.name == "django_eddyq.worker.planning"
    assert f"eddyq job {last.pk} (tests.jobs.always_fails) failed for good" in error.message
    assert error.exc_info is not None and isinstance(error.exc_info[1], ValueError)
    assert (error.eddyq_job_id, error.eddyq_task, error.eddyq_queue) == (  # type: ignore[attr-defined]
        last.pk,
        "tests.jobs.always_fails",
        "default",
    )
    assert error.eddyq_worker_id == worker.id  # type: ignore[attr-defined]
    [warning] = [r for r in caplog.records if "failed attempt 1 of 3" in r.message]
    assert warning.levelno == logging.WARNING and warning.exc_info is not None
    assert f"eddyq job {retried.pk}" in warning.message


def test_each_attempt_names_its_worker(run_burst_worker: RunWorker) -> None:
    job = jobs.add.enqueue(1, 1)
    worker = run_burst_worker()
    stored = Job.objects.get(pk=job.pk)
    assert (stored.attempted_by, stored.locked_by) == (worker.id, None)


# The registry of workers.


def test_a_worker_registers_and_says_it_stopped(fast_settings: None) -> None:
    worker = Worker(burst=True, concurrency=3, queues=["default", "emails"], maintenance=False)
    worker.run()
    row = WorkerProcess.objects.get(pk=worker.id)
    host, pid, _suffix = worker.id.split(":")
    assert (row.host, row.pid, row.concurrency, row.queues) == (
        host,
        int(pid),
        3,
        ["default", "emails"],
    )
    assert row.stopped_at is not None and row.last_seen_at >= row.started_at
    assert (row.running, row.leader) == (0, False)


@pytest.mark.processes
def test_a_killed_worker_stays_in_the_registry_unstopped(start_worker: StartWorker) -> None:
    process = start_worker("--concurrency", "1")
    wait_for(lambda: WorkerProcess.objects.filter(pid=process.pid).exists(), seconds=20)
    row = WorkerProcess.objects.get(pid=process.pid)
    wait_for(lambda: WorkerProcess.objects.get(pk=row.pk).leader, seconds=20)
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    killed = WorkerProcess.objects.get(pk=row.pk)
    assert killed.stopped_at is None  # lost, not stopped: it never said goodbye


# What the command prints.


def run_command(environment: dict[str, str], *arguments: str) -> str:
    done = subprocess.run(
        [sys.executable, str(MANAGE), "eddyq_worker", "--burst", *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


@pytest.mark.processes
def test_the_banner_and_the_lines_on_stdout(worker_environment: dict[str, str]) -> None:
    # Whatever LOGGING says: here, nothing of django_eddyq's logs reaches the output.
    worker_environment["DJANGO_LOG_LEVEL"] = "CRITICAL"
    job = jobs.add.enqueue(20, 22)
    out = run_command(worker_environment, "--concurrency", "2", "-v", "2")
    settings = connection.settings_dict
    lines = out.splitlines()
    assert lines[0].startswith("django-eddyq ") and ": eddyq_worker on " in lines[0]
    assert "  queues: all; concurrency 2; processes 1; burst" in lines
    assert f"  database default: {settings['USER']}@" in out
    assert settings["PASSWORD"] == "" or settings["PASSWORD"] not in out
    assert "  wakes on LISTEN/NOTIFY, and a poll every 100ms" in lines
    assert "  maintenance: on (takes part in the leader election)" in lines
    [started] = [line for line in lines if line.startswith("worker ") and " started " in line]
    worker_id = started.split()[1]
    assert f"job {job.pk} tests.jobs.add (queue default, attempt 1): completed in " in out
    assert f"worker {worker_id} stopped: 1 jobs finished, 0 handed back" in lines
    assert WorkerProcess.objects.filter(pk=worker_id).exists()


@pytest.mark.processes
def test_verbosity_zero_prints_nothing(worker_environment: dict[str, str]) -> None:
    worker_environment["DJANGO_LOG_LEVEL"] = "CRITICAL"
    jobs.add.enqueue(1, 1)
    assert run_command(worker_environment, "-v", "0") == ""


def test_an_outage_that_lasts_becomes_an_error_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A lost connection is one WARNING; still lost after PERSISTENT_OUTAGE_SECONDS, one ERROR."""
    monkeypatch.setattr(lifecycle, "PERSISTENT_OUTAGE_SECONDS", 0.0)
    monkeypatch.setattr(lifecycle, "FIRST_RETRY_SECONDS", 0.001)

    class Unreachable(lifecycle.Loop):
        name = "probe"
        passes = 0

        def interval(self) -> float:
            return 0.001

        def run_once(self, now: Any = None) -> int:
            self.passes += 1
            if self.passes >= 5:
                self.stop()
            raise psycopg.OperationalError("the server went away")

    Unreachable().run()
    levels = [r.levelname for r in caplog.records if "eddyq probe" in r.message]
    assert levels == ["WARNING", "ERROR"]
