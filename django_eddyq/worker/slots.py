"""The worker's slots: its handler threads and event loop, and the jobs queued for and run on them.

A thread is a slot, for async handlers too (it waits for the event loop to run them), so that the
worker's concurrency bounds both. The worker's main thread owns the bookkeeping here: it starts
claimed jobs, collects their outcomes, times them out, cancels them and takes back the ones not
started yet. Handler threads only take queued jobs (from ``_ready``, which the main thread may
take them back from) and hand back outcomes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from django.db import connections

from django_eddyq import current, metrics, registry, tracing
from django_eddyq.exceptions import TaskNotFound
from django_eddyq.signals import job_started, send
from django_eddyq.worker.event_loop import EVENT_LOOP_STOP_SECONDS, EventLoop
from django_eddyq.worker.execution import (
    ClaimedJob,
    Outcome,
    RunningJob,
    cancelled,
    failure,
    malformed,
    returned,
    run_atomic,
    run_sync,
    timed_out,
)
from django_eddyq.worker.pacing import Pacing

logger = logging.getLogger(__name__)

# A handler still running this long after its timeout is stuck: its thread (or the event loop)
# is not coming back. Short, since its job is already recorded as timed out; long enough for a
# handler that is merely slow to unwind.
STUCK_GRACE_SECONDS = 3.0


class Slots:
    """The worker's ``concurrency`` handler threads, its event loop, and the jobs they run.

    The methods that decide outcomes return them, for the worker to write.
    """

    def __init__(
        self,
        *,
        concurrency: int,
        worker_id: str,
        pacing: Pacing,
        wake: Callable[[], None],
        signal_sender: type,
    ) -> None:
        self.concurrency = concurrency
        self.worker_id = worker_id
        self._signal_sender = signal_sender  # the Worker class, as the job signals' sender
        self._pacing = pacing
        self._wake = wake  # the worker's: a handler ended, or a cancel request came
        self._threads: list[threading.Thread] = []
        self._work: queue.SimpleQueue[RunningJob | None] = queue.SimpleQueue()
        self.event_loop = EventLoop(worker_id)
        # Every job started here (queued or running), until its outcome is written or its
        # lease lost.
        self.running: dict[int, RunningJob] = {}
        # Claimed and queued for the handler threads, not yet started. Whoever pops a job first
        # (a thread starting it, or the main thread taking it back) has it.
        self._ready: dict[int, RunningJob] = {}
        self.finished: deque[tuple[RunningJob, Outcome]] = deque()  # appended by handlers
        self._cancel_requests: deque[int] = deque()  # appended by the listener
        # Timed out, their outcome decided, but their handler has not returned: each still
        # holds its slot.
        self._overrun: set[RunningJob] = set()

    def start_threads(self) -> None:
        for number in range(self.concurrency):
            thread = threading.Thread(
                target=self._handler_thread,
                args=(f"{self.worker_id}/{number}",),
                name=f"eddyq-handler-{number}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        self.event_loop.start()

    def stop_threads(self) -> None:
        for _ in self._threads:
            self._work.put(None)
        self.event_loop.close()

    # Main thread.
    def start(self, job: ClaimedJob) -> None:
        """Queue a claimed job for the next free handler thread."""
        if job.problem is not None:
            self._fail_at_once(job, malformed(job))
            return
        try:
            handler = registry.handler(job.task)
        except TaskNotFound as error:
            # Retried: during a rolling deploy, a worker with newer code may know the task.
            self._fail_at_once(job, failure(job, None, error))
            return
        running = RunningJob(job, handler, None)
        self.running[job.id] = running
        self._ready[job.id] = running
        self._work.put(running)

    def _fail_at_once(self, job: ClaimedJob, outcome: Outcome) -> None:
        """A claimed job that cannot start ends with ``outcome``, as if its handler had run."""
        running = RunningJob(job, None, None)
        self.running[job.id] = running
        tracing.failed_at_once(job, self.worker_id, outcome)
        self.finished.append((running, outcome))

    def collect_finished(self) -> list[Outcome]:
        """The outcomes the handlers handed back since the last call, for the jobs they still
        decide (a timed-out or lost job's was decided without them)."""
        outcomes: list[Outcome] = []
        pacing, finished = self._pacing, self.finished
        while finished:
            running, outcome = finished.popleft()
            pacing.held -= 1
            if running.started_at is not None:
                pacing.ran(time.monotonic() - running.started_at)
            if running in self._overrun:
                self._overrun.discard(running)
                if running.stuck_logged:
                    logger.info(
                        "eddyq job %s (%s): its handler returned after all, freeing its slot",
                        running.job.id,
                        running.job.task,
                    )
            if not running.settled:
                running.settled = True
                if running.cancel.requested and outcome.state != "completed":
                    # Cancelled, then it raised (or snoozed): it ends cancelled, not retried.
                    outcome = cancelled(outcome)
                elif running.interrupted and outcome.state != "completed":
                    # Cancelled by this worker's stop, and now ended: it goes back unspent.
                    outcome = returned(running.job)
                outcomes.append(outcome)
            elif outcome.committed:
                # An atomic job's completion, committed as the worker gave the job up (timed
                # out, or its lease seen lost as that commit ended it): the stored outcome.
                outcomes.append(outcome)
        return outcomes

    def check_deadlines(self) -> list[Outcome]:
        """The jobs whose handlers ran past their timeouts end timed out."""
        outcomes: list[Outcome] = []
        now = time.monotonic()
        for running in self.running.values():
            if (
                not running.settled
                and running.deadline is not None
                and now >= running.deadline
                and running.handler is not None
            ):
                # The thread can't be killed: it keeps its slot until the handler returns.
                running.settled = True
                self._overrun.add(running)
                outcome = timed_out(running.job, running.handler)
                outcomes.append(cancelled(outcome) if running.cancel.requested else outcome)
        return outcomes

    def stuck(self) -> list[RunningJob]:
        """The handlers still running ``STUCK_GRACE_SECONDS`` after their timeout, their jobs'
        outcomes already recorded; each is logged once (a WARNING) while some slot is free."""
        now = time.monotonic()
        stuck = sorted(
            (
                running
                for running in self._overrun
                if running.seconds_over(now) >= STUCK_GRACE_SECONDS
                and self.running.get(running.job.id) is not running
            ),
            key=lambda running: running.job.id,
        )
        if len(stuck) < self.concurrency:
            for running in stuck:
                if not running.stuck_logged:
                    running.stuck_logged = True
                    logger.warning(
                        "eddyq job %s (%s): its handler is still running %.1fs after its "
                        "timeout and keeps its slot: %d of worker %s's %d slots are stuck",
                        running.job.id,
                        running.job.task,
                        running.seconds_over(now),
                        len(stuck),
                        self.worker_id,
                        self.concurrency,
                    )
        return stuck

    def return_ready(self, waited: float = 0.0) -> list[Outcome]:
        """Jobs not yet started, queued at least ``waited`` seconds ago, go back to available,
        their attempt given back."""
        outcomes: list[Outcome] = []
        queued_before = time.monotonic() - waited
        for job_id, running in list(self._ready.items()):
            if running.queued_at <= queued_before and self._take_back(job_id) is not None:
                outcomes.append(returned(running.job))
                self._pacing.pace_lost()
        return outcomes

    def _take_back(self, job_id: int) -> RunningJob | None:
        """The job, if no handler thread has started it yet, which now none will."""
        running = self._ready.pop(job_id, None)
        if running is not None:
            running.settled = True
            self._pacing.held -= 1
        return running

    def apply_cancel_requests(self, job_ids: Iterable[int] = ()) -> list[Outcome]:
        """Cancel the jobs asked for (those given, and those the listener heard of): one not
        started yet ends cancelled at once; a running one's handler is asked to stop."""
        self._cancel_requests.extend(job_ids)
        outcomes: list[Outcome] = []
        while self._cancel_requests:
            job_id = self._cancel_requests.popleft()
            waiting = self._take_back(job_id)
            if waiting is not None:
                outcomes.append(cancelled(returned(waiting.job)))
                logger.info(
                    "eddyq job %s (%s): cancelled before it started", job_id, waiting.job.task
                )
                continue
            running = self.running.get(job_id)
            if running is None or running.settled or running.cancel.requested:
                continue
            self._request_cancel(running)
            logger.info("eddyq job %s (%s): cancel requested", running.job.id, running.job.task)
        return outcomes

    def _request_cancel(self, running: RunningJob) -> None:
        """Raise the job's cancel flag; an async handler's task is cancelled too (the
        CancelledError is raised inside it, and one that catches it and returns anyway
        still completes)."""
        running.cancel.requested = True
        if running.task is not None:
            self.event_loop.cancel(running.task)

    def lost(self, job_id: int) -> None:
        """The job's lease was lost: it is no longer this worker's, whatever its handler does."""
        running = self.running.pop(job_id)
        running.settled = True
        if running.committing:
            # Its atomic handler has returned and its transaction decides: if it committed the
            # completion (which is why the lease was not renewed), its outcome still comes.
            return
        if self._take_back(job_id) is not None:
            logger.warning(
                "eddyq job %s (%s) is no longer this worker's: its lease was lost before "
                "it started; it will not run here",
                job_id,
                running.job.task,
            )
            return
        # As for a cancelled job: a handler that checks cancel_requested() stops early.
        self._request_cancel(running)
        logger.warning(
            "eddyq job %s (%s) is no longer this worker's: its lease was lost; its handler "
            "is asked to stop, and its result will be discarded",
            job_id,
            running.job.task,
        )

    def next_wait(self, now: float, ready_max_wait: float) -> float:
        """Seconds until a queued job has waited too long, a handler times out, or one that
        timed out counts as stuck (infinite: none of these)."""
        wait = float("inf")
        # Read in one step: a handler thread may take the last queued job between a check of
        # the dict and a read of it.
        if ready := list(self._ready.values()):
            wait = max(ready[0].queued_at + ready_max_wait - now, 0.0)
        for running in self.running.values():
            if running.deadline is not None and not running.settled:
                wait = min(wait, max(running.deadline - now, 0.0))
        for running in self._overrun:
            # When it will count as stuck (a wait of 0 once it does would spin).
            if running.deadline is not None and running.deadline + STUCK_GRACE_SECONDS > now:
                wait = min(wait, running.deadline + STUCK_GRACE_SECONDS - now)
        return wait

    def hand_back(self, wait: Callable[[float], None]) -> tuple[list[Outcome], list[int]]:
        """At the end: jobs not yet started go back to available, their attempt not counted;
        async handlers still running are cancelled, and handed back once they have ended
        (``wait`` is the worker's, which handlers cut short). A sync handler cannot be stopped:
        its job is left running, for the rescuer. Returns the outcomes to write, and the jobs
        left running."""
        outcomes = self.collect_finished()
        outcomes += self.return_ready()
        outcomes += self._interrupt_async_handlers(wait)
        outcomes += self.collect_finished()
        left: list[int] = []
        for running in self.running.values():
            if running.settled:
                continue
            running.settled = True
            if running.cancel.requested:
                outcomes.append(cancelled(returned(running.job)))
                continue
            left.append(running.job.id)
            logger.warning(
                "eddyq job %s (%s) still runs at the end of the shutdown timeout: left to the "
                "rescuer, which retries it once its lease expires",
                running.job.id,
                running.job.task,
            )
        return outcomes, left

    def _interrupt_async_handlers(self, wait: Callable[[float], None]) -> list[Outcome]:
        """Cancel the async handlers still running, and give them a moment to end: each that
        ends is handed back (see ``collect_finished``)."""
        interrupted = [
            running
            for running in self.running.values()
            if not running.settled and running.future is not None
        ]
        for running in interrupted:
            running.interrupted = True
            assert running.future is not None
            running.future.cancel()
        outcomes: list[Outcome] = []
        deadline = time.monotonic() + EVENT_LOOP_STOP_SECONDS
        while time.monotonic() < deadline and not all(running.settled for running in interrupted):
            wait(deadline - time.monotonic())
            outcomes += self.collect_finished()
        return outcomes

    # Listener thread.
    def on_control_notification(self, payload: str) -> None:
        kind, _, job_id = payload.partition(":")
        if kind == "cancel" and job_id.isdigit():
            self._cancel_requests.append(int(job_id))
            self._wake()

    # Handler threads.
    def _handler_thread(self, source: str) -> None:
        """Runs jobs one at a time; waits for the event loop to run an async one. ``source``:
        the thread's own activity row, which its atomic jobs' completions are counted into."""
        while True:
            # A thread going straight from one job to the next checked its database
            # connections as the last one ended; one that waited for work checks them again.
            try:
                running = self._work.get_nowait()
                connections_checked = True
            except queue.Empty:
                running = self._work.get()
                connections_checked = False
            if running is None:
                # Django opens a connection per thread and never closes one whose thread
                # ended: without this, each stopped worker leaves a server backend behind
                # until the garbage collector happens upon it.
                connections.close_all()
                return
            if self._ready.pop(running.job.id, None) is None:
                continue  # taken back before it started: stopping, cancelled, lease lost
            handler = running.handler
            assert handler is not None
            send(job_started, self._signal_sender, job=running.job, worker_id=self.worker_id)
            if metrics.recording:
                metrics.job_started(running.job)
            running.started_at = started = time.monotonic()
            if handler.timeout is not None:
                running.deadline = started + handler.timeout
            # The attempt's span (None while tracing is off), current while the handler runs.
            span = tracing.start_attempt(running.job, self.worker_id)
            if handler.is_async:
                outcome = self.event_loop.run(running, handler)
            else:
                token = current.enter(running.job, running.cancel)
                try:
                    if handler.atomic:
                        outcome = run_atomic(
                            running,
                            handler,
                            worker_id=self.worker_id,
                            source=source,
                            connections_checked=connections_checked,
                        )
                    else:
                        outcome = run_sync(running.job, handler, connections_checked)
                finally:
                    current.leave(token)
            outcome.duration = time.monotonic() - started
            if span is not None:
                tracing.end_attempt(span, running, outcome)
            self.finished.append((running, outcome))
            self._wake()
