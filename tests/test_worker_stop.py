"""How a worker in this process ends: its event loop closed, and giving up when every slot is
stuck past its timeout."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_eddyq.models import Job
from django_eddyq.worker import Worker, slots
from django_eddyq.worker import worker as worker_module
from tests import jobs
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


@contextlib.contextmanager
def resource_warnings() -> Iterator[list[str]]:
    """The ResourceWarnings of what is dropped inside the block (a connection or a loop left
    unclosed warns as it is deleted), collected at its end. What earlier tests left for the
    collector (connections of their handler threads) is collected first, so that only what
    the block leaves is recorded."""
    gc.collect()
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield messages
        gc.collect()
    messages += [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_stop_closes_the_event_loop(run_burst_worker: RunWorker) -> None:
    job = jobs.async_add.enqueue(1, 2)
    with resource_warnings() as warned:
        worker = run_burst_worker()
        loop = worker._slots.event_loop.loop
        assert loop is not None and loop.is_closed()
        del worker, loop
    assert state(job) == Job.State.COMPLETED
    assert warned == []


def test_the_handler_threads_close_their_connections_as_they_end(
    run_burst_worker: RunWorker, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kept open between jobs, as django_eddyq.W004 advises: only a thread's end closes them.
    monkeypatch.setitem(settings.DATABASES["default"], "CONN_MAX_AGE", 600)
    for label in "abcd":
        jobs.record.enqueue(label)
    with resource_warnings() as warned:
        threads = run_burst_worker(concurrency=4)._slots._threads
        wait_for(lambda: not any(thread.is_alive() for thread in threads))
    assert Job.objects.filter(state=Job.State.COMPLETED).count() == 4
    assert warned == []


def test_stop_cancels_the_async_handlers_left_and_closes_the_loop(fast_settings: None) -> None:
    job = jobs.async_waits.enqueue(60)
    worker = Worker(concurrency=1, shutdown_timeout=0.2, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: state(job) == Job.State.RUNNING)
        loop = worker._slots.event_loop.loop
        assert loop is not None
        [task] = asyncio_tasks(worker)
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert loop.is_closed()
    assert task.cancelled()
    assert state(job) == Job.State.AVAILABLE  # handed back, not failed by the cancellation
    assert worker.exit_code == 0


def asyncio_tasks(worker: Worker) -> list[asyncio.Task[Any]]:
    """The handler tasks on the worker's event loop, once they have started."""
    wait_for(lambda: all(r.task is not None for r in worker._slots.running.values()))
    return [r.task for r in worker._slots.running.values() if r.task is not None]


def test_a_worker_whose_every_slot_is_stuck_stops_with_an_exit_code(
    fast_settings: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(slots, "STUCK_GRACE_SECONDS", 0.5)
    stuck = jobs.never_returns.enqueue()  # times out after 0.3s; its thread stays blocked
    worker = Worker(concurrency=1, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert worker.exit_code == worker_module.STUCK_EXIT_CODE
    assert state(stuck) == Job.State.FAILED
    [error] = [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "ERROR" and "of its slots" in r.getMessage()
    ]
    assert f"worker {worker.id}: all 1 of its slots are held by handlers" in error
    assert f"job {stuck.pk} (tests.jobs.never_returns)" in error


class TakenWhileRead(dict[int, Any]):
    """A queue of jobs that a handler thread empties between a check and a read."""

    def __bool__(self) -> bool:
        return True


def test_the_wait_survives_a_handler_taking_the_last_queued_job_meanwhile() -> None:
    worker = Worker(concurrency=1, maintenance=False)
    worker._slots._ready = TakenWhileRead()
    assert worker._slots.next_wait(now=0.0, ready_max_wait=1.0) == float("inf")
