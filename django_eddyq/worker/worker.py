"""The worker: claims jobs, runs their handlers, renews their leases and records how they ended."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import queue
import secrets
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_until_done
from datetime import datetime
from typing import Any, NoReturn

import psycopg
from django.db import connections

from django_eddyq import registry, sql
from django_eddyq.base import validate_queue_name
from django_eddyq.batches import complete_batches
from django_eddyq.cancellation import CancelFlag, current_flag
from django_eddyq.conf import eddyq_settings
from django_eddyq.election import Elector
from django_eddyq.exceptions import TaskNotFound
from django_eddyq.handlers import Handler
from django_eddyq.lifecycle import DATABASE_UNREACHABLE, Loop
from django_eddyq.listener import Listener
from django_eddyq.maintenance import Rescuer, all_services
from django_eddyq.producer import due_for_touch
from django_eddyq.worker import passes
from django_eddyq.worker.execution import (
    ClaimedJob,
    Outcome,
    cancelled,
    failure,
    malformed,
    not_stored,
    returned,
    run_async,
    run_sync,
    timed_out,
)
from django_eddyq.worker.passes import Pass, run_pass

logger = logging.getLogger("django_eddyq")

# Reconnection waits grow from this, doubling, up to the cap.
RECONNECT_FIRST_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 10.0
# A handler still running this long after its timeout is stuck: its thread (or the event loop)
# is not coming back. Short, since its job is already recorded as timed out; long enough for a
# handler that is merely slow to unwind.
STUCK_GRACE_SECONDS = 3.0
# How a worker process ends when every one of its slots is stuck (EX_TEMPFAIL: start me again).
STUCK_EXIT_CODE = 75
# Claiming ahead: while jobs finish quickly, a pass claims more jobs than it has free slots, so
# that one commit serves more of them; handler threads take the next one as soon as they are
# free. The extra ones wait about this long at most at the recent pace of the worker's jobs
# (none are claimed ahead of slow jobs, so that other workers get them)...
CLAIM_AHEAD_SECONDS = 0.02
# ... and never more than this many times its concurrency (a bound only for jobs of well under a
# millisecond). One that has not started after READY_MAX_WAIT_SECONDS (long jobs took every
# slot meanwhile) goes back to the queue.
CLAIM_AHEAD_FACTOR = 10
READY_MAX_WAIT_SECONDS = 1.0
# When stopping, a job not started this long after it was queued goes back at once: a free
# thread takes a queued job up within a moment, so it is waiting for a slot.
STOPPING_READY_MAX_WAIT_SECONDS = 0.05
# How much each finished job moves the average run time (an exponential moving average).
RUN_TIME_WEIGHT = 0.2
# How long stopping waits for the event loop's thread, then for its cancelled tasks.
EVENT_LOOP_STOP_SECONDS = 2.0


def make_worker_id() -> str:
    """Unique per process and start: host, pid and a random suffix (pids get reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclasses.dataclass(slots=True, eq=False)
class RunningJob:
    """A claimed job whose handler was started; main-thread bookkeeping."""

    job: ClaimedJob
    handler: Handler | None
    deadline: float | None  # time.monotonic() after which the attempt has timed out
    settled: bool = False  # its outcome is already decided (timed out, lost): ignore a late one
    cancel: CancelFlag = dataclasses.field(default_factory=CancelFlag)
    future: Future[Outcome] | None = None  # an async handler's result
    task: asyncio.Task[Outcome] | None = None  # an async handler's task, to cancel it
    stuck_logged: bool = False  # still running past its timeout and the grace: said once
    queued_at: float = dataclasses.field(default_factory=time.monotonic)
    started_at: float | None = None  # time.monotonic() when a handler thread started it
    interrupted: bool = False  # cancelled by the worker's own stop: handed back once it ends


class Worker(Loop):
    """One worker process's job loop.

    The main thread owns all bookkeeping; handler threads only take queued jobs (from
    ``_ready``, which the main thread may take them back from) and hand back outcomes; the
    database thread runs the passes the main thread plans, on the worker's own connection, one
    at a time. Each pass writes the finished jobs in one statement, renews leases when due,
    then claims as many jobs as there are free slots (and, while its jobs finish quickly, a few
    more: see ``_claim_room``), all in one transaction.
    """

    name = "worker"

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        burst: bool = False,
        shutdown_timeout: float = 30.0,
        maintenance: bool = True,
        worker_id: str | None = None,
    ) -> None:
        super().__init__()
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.queues = [validate_queue_name(name) for name in queues] if queues else None
        self.concurrency = concurrency
        self.burst = burst
        self.shutdown_timeout = shutdown_timeout
        self.maintenance = maintenance
        self.id = worker_id or make_worker_id()
        self.elector: Elector | None = None

        self._connection: psycopg.Connection[tuple[Any, ...]] | None = None
        self._listener: Listener | None = None
        self._threads: list[threading.Thread] = []
        # Passes for the database thread; the one sent and not yet acted on, with its result.
        self._passes: queue.SimpleQueue[tuple[Pass, Future[Pass]] | None] = queue.SimpleQueue()
        self._in_flight: tuple[Pass, Future[Pass]] | None = None
        self._work: queue.SimpleQueue[RunningJob | None] = queue.SimpleQueue()
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._event_loop_thread: threading.Thread | None = None

        self._running: dict[int, RunningJob] = {}
        # Claimed and queued for the handler threads, not yet started. Whoever pops a job first
        # (a thread starting it, or the main thread taking it back) has it.
        self._ready: dict[int, RunningJob] = {}
        self._busy_slots = 0
        self._run_seconds: float | None = None  # the recent average, from start to collected
        self._finished: deque[tuple[RunningJob, Outcome]] = deque()  # appended by handlers
        self._cancel_requests: deque[int] = deque()  # appended by the listener
        self._queues_touched_at: dict[str, float] = {}
        self._queues_to_touch: list[str] = []
        self._to_write: list[Outcome] = []
        self._next_heartbeat = 0.0
        # A claim that came back full: more jobs may be waiting. After one that came back
        # short, the next waits for a notification of new jobs, outcomes to write, or the poll
        # interval.
        self._claim_more = False
        self._jobs_notified = False
        self._next_poll = 0.0
        self._drain_deadline: float | None = None
        # Timed out, their outcome decided, but their handler has not returned: each still
        # holds its slot.
        self._overrun: set[RunningJob] = set()
        # Jobs whose outcome the database refused to store in any form: never handed back
        # (their handler ran), they wait for their lease to expire.
        self._left_to_rescuer: set[int] = set()
        self.processed = 0
        # 0, or STUCK_EXIT_CODE once the worker gave up because every slot was stuck: the
        # process should exit with it (see run_in_this_process), to be replaced.
        self.exit_code = 0
        # The jobs whose handlers were still running when the worker stopped, left to the
        # rescuer: their process must end at once (see run_in_this_process).
        self.abandoned: list[int] = []

    # Lifecycle.
    def on_start(self) -> None:
        registry.discover()
        self._connection = passes.connect()
        if eddyq_settings.RECOVER_STALE_ON_START:
            self._recover_stale()
        listener = Listener() if eddyq_settings.LISTEN_NOTIFY else None
        if listener is not None:
            listener.subscribe(sql.JOBS_CHANNEL, self._on_jobs_notification)
            listener.subscribe(sql.CONTROL_CHANNEL, self._on_control_notification)
        if self.maintenance:
            self.elector = Elector(self.id, all_services())
            if listener is not None:
                listener.subscribe(sql.LEADER_CHANNEL, self.elector.on_leader_notification)
                for service in self.elector.services:
                    if service.wake_on is not None:
                        listener.subscribe(service.wake_on, service.on_notification)
        if listener is not None:
            listener.start()
            self._listener = listener
        if self.elector is not None:
            self.elector.start()
        database_thread = threading.Thread(
            target=self._database_thread, name="eddyq-database", daemon=True
        )
        database_thread.start()
        for number in range(self.concurrency):
            thread = threading.Thread(
                target=self._handler_thread, name=f"eddyq-handler-{number}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        self._event_loop = asyncio.new_event_loop()
        self._event_loop_thread = threading.Thread(
            target=self._event_loop.run_forever, name="eddyq-event-loop", daemon=True
        )
        self._event_loop_thread.start()
        self._next_heartbeat = time.monotonic() + self._heartbeat_seconds()
        logger.info(
            "eddyq worker %s started: queues %s, concurrency %d%s",
            self.id,
            ", ".join(self.queues) if self.queues else "all",
            self.concurrency,
            ", burst" if self.burst else "",
        )

    def on_stop(self) -> None:
        if self.elector is not None:
            self.elector.stop()
            self.elector.join()
        if self._listener is not None:
            self._listener.stop()
        for _ in self._threads:
            self._work.put(None)
        self._passes.put(None)
        self._close_event_loop()
        if self._connection is not None:
            self._connection.close()
        logger.info("eddyq worker %s stopped after %d jobs", self.id, self.processed)

    def _close_event_loop(self) -> None:
        """Stop the event loop, cancel the tasks left on it, and close it.

        A handler that blocks the loop's thread keeps it from stopping: then the loop is left
        as it is (its thread is a daemon) rather than holding up the stop.
        """
        loop, thread = self._event_loop, self._event_loop_thread
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(EVENT_LOOP_STOP_SECONDS)
            if thread.is_alive():
                logger.warning(
                    "eddyq worker %s: its event loop is blocked by a handler; left unclosed",
                    self.id,
                )
                return
        try:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=EVENT_LOOP_STOP_SECONDS))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except Exception:
            logger.exception("eddyq worker %s: shutting its event loop down failed", self.id)
        finally:
            # Also shuts the loop's default executor down, without waiting for its threads.
            loop.close()

    def stop(self) -> None:
        """Stop claiming; running jobs get ``shutdown_timeout`` seconds to finish."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.shutdown_timeout
        # Leadership is handed over at once, not after the drain.
        if self.elector is not None:
            self.elector.stop()
        super().stop()

    def interval(self) -> float:
        return eddyq_settings.POLL_INTERVAL.total_seconds()

    def run(self) -> None:
        self.on_start()
        try:
            while True:
                try:
                    self.run_once()
                except DATABASE_UNREACHABLE as error:
                    self._reconnect(error)
                    continue
                except Exception:
                    # A pass that fails is handled where it ends (_committed_pass): this is a
                    # fault of the worker's own, which must not end it either.
                    logger.exception("eddyq worker %s: its loop failed; going on", self.id)
                    if self._past_drain_deadline():
                        break
                    self.wait(self.interval())
                    continue
                if not self.stopping:
                    stuck = self._stuck_handlers()
                    if len(stuck) >= self.concurrency:
                        self._give_up(stuck)
                        break
                if (
                    self.stopping
                    and self._in_flight is None
                    and (not self._running or self._past_drain_deadline())
                ):
                    break
                if self.burst and self._idle():
                    break
                self.wait(self._next_wait())
            self._hand_back_unfinished()
        finally:
            self.on_stop()

    # One pass.
    def run_once(self, now: datetime | None = None) -> int:
        """Act on the pass in flight once it has committed; plan and send the next one.

        The next pass goes to the database thread before the jobs the last one claimed are
        started, so that the database runs it while this thread starts them; with nothing to
        do meanwhile, this thread runs it itself (a job waiting alone starts sooner). What a
        pass means for this worker (jobs started, outcomes written, leases given up) is acted
        on only once it has committed. Returns the rows the pass acted on changed.
        """
        self._apply_cancel_requests()
        self._collect_finished()
        self._return_ready(waited=self._ready_max_wait())
        self._check_deadlines()
        done = self._committed_pass()
        if self._in_flight is None and (planned := self._plan()) is not None:
            self._send(planned, here=done is None)
            if done is None:
                done = self._committed_pass()
        if done is None:
            return 0
        self._act_on(done)
        return done.changed

    def _committed_pass(self) -> Pass | None:
        """The pass in flight, if it has committed; a connection error if it was lost.

        A pass that failed for any other reason (a value the database refused) is dealt with
        here, and None returned: see ``_recover_from``.
        """
        if self._in_flight is None or not self._in_flight[1].done():
            return None
        planned, result = self._in_flight
        self._in_flight = None
        try:
            done = result.result()
        except DATABASE_UNREACHABLE:
            # Not written, or written without a reply: the outcomes go in the next pass, whose
            # fence stores each at most once.
            self._to_write[:0] = planned.outcomes
            raise
        except Exception as error:
            self._recover_from(planned, error)
            return None
        # What the next plan must know at once; the rest waits for _act_on.
        self._busy_slots += len(done.claimed)
        if done.claim:
            self._claim_more = len(done.claimed) == done.claim
            if not self._claim_more:
                self._next_poll = time.monotonic() + self.interval()
        return done

    def _recover_from(self, failed: Pass, error: Exception) -> None:
        """After a pass that failed for a reason other than the connection, and so wrote
        nothing: its outcomes are written one at a time, so that only a job whose outcome the
        database refuses fails (saying why), and the rest of the pass runs again later."""
        logger.error(
            "eddyq worker %s: a pass failed (%s: %s); writing its %d outcomes one at a time",
            self.id,
            type(error).__name__,
            error,
            len(failed.outcomes),
            exc_info=error,
        )
        for index, outcome in enumerate(failed.outcomes):
            try:
                self._write_alone(outcome)
            except DATABASE_UNREACHABLE:
                self._to_write[:0] = failed.outcomes[index:]
                raise
        if failed.renew:
            self._next_heartbeat = 0.0
        self._queues_to_touch.extend(failed.touch)
        if failed.claim:
            # The claim waits for the poll interval, lest a claim that fails fail in a loop.
            self._claim_more = False
            self._next_poll = time.monotonic() + self.interval()
            # Its results may have failed after it committed.
            self._hand_back_strays()

    def _write_alone(self, outcome: Outcome) -> None:
        """Write ``outcome`` in a pass of its own; if the database refuses it, fail its job with
        an error entry saying why; if even that is refused, leave the job to the rescuer."""
        try:
            self._act_on(self._run_pass(_writing(outcome)))
            return
        except DATABASE_UNREACHABLE:
            raise
        except Exception as error:
            set_aside = not_stored(outcome, error)
        try:
            self._act_on(self._run_pass(_writing(set_aside)))
        except DATABASE_UNREACHABLE:
            raise
        except Exception:
            job = outcome.job
            logger.exception(
                "eddyq job %s (%s): neither its outcome nor its failure could be stored; "
                "its lease is no longer renewed, and the rescuer will take it",
                job.id,
                job.task,
            )
            self._running.pop(job.id, None)
            self._left_to_rescuer.add(job.id)

    def _hand_back_strays(self) -> None:
        """Jobs running under this worker's id that it does not know of (claimed by a pass
        whose reply never came) go back, their attempt given back."""
        assert self._connection is not None
        known = [
            *self._running,
            *(outcome.job.id for outcome in self._to_write),
            *self._left_to_rescuer,
        ]
        with self._connection.transaction():
            rows = self._connection.execute(
                sql.HAND_BACK_STRAYS, {"worker_id": self.id, "known": known}
            ).fetchall()
            ended = {batch for _id, state, batch, _ in rows if batch and state != "available"}
            if ended:
                with self._connection.cursor() as cursor:
                    complete_batches(cursor, sorted(ended))
        for job_id, state, _batch, _notified in rows:
            logger.warning(
                "eddyq worker %s: job %s was claimed by a pass whose reply was lost; %s",
                self.id,
                job_id,
                "handed back" if state == "available" else "cancelled, as was asked",
            )

    def _plan(self) -> Pass | None:
        """The next pass: what finished, a heartbeat when due, a claim when there is room."""
        now = time.monotonic()
        renew: list[int] = []
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self._heartbeat_seconds()
            renew = [job_id for job_id, running in self._running.items() if not running.settled]
        claim = 0
        if self._wants_to_claim(now):
            claim = claim_limit(self._claim_room())
            self._jobs_notified = False
        planned = Pass(
            outcomes=self._to_write,
            renew=renew,
            # A burst worker promotes due jobs itself, but only once the available ones run
            # short: not a statement in every pass.
            promote=self.burst and claim > 0 and not self._claim_more,
            claim=claim,
            touch=self._queues_to_touch,
        )
        if planned.is_empty():
            return None
        self._to_write, self._queues_to_touch = [], []
        return planned

    def _wants_to_claim(self, now: float) -> bool:
        """Whether to claim: with room, when jobs may be waiting. A pass that writes outcomes
        claims after them, so that it sees what they made available (a batch's callback, a
        job a handler enqueued)."""
        return (
            not self.stopping
            and self._claim_room() > 0
            and (
                self._claim_more
                or self._jobs_notified
                or bool(self._to_write)
                or now >= self._next_poll
            )
        )

    def _send(self, planned: Pass, *, here: bool) -> None:
        """Run the pass on this thread (``here``), or hand it to the database thread."""
        result: Future[Pass] = Future()
        self._in_flight = (planned, result)
        if here:
            self._run_into(planned, result)
        else:
            self._passes.put((planned, result))

    def _database_thread(self) -> None:
        """Runs the passes the main thread sends, and wakes it when each has ended."""
        while (item := self._passes.get()) is not None:
            self._run_into(*item)
            self.wake()

    def _run_into(self, planned: Pass, result: Future[Pass]) -> None:
        try:
            result.set_result(self._run_pass(planned))
        except BaseException as error:
            result.set_exception(error)

    def _run_pass(self, planned: Pass) -> Pass:
        assert self._connection is not None
        return run_pass(
            self._connection,
            planned,
            worker_id=self.id,
            lease_seconds=self._lease_seconds(),
            queues=self.queues,
        )

    def _act_on(self, done: Pass) -> None:
        """What a committed pass means for this worker."""
        if done.outcomes:
            self._outcomes_written(done.outcomes, done.written)
        if done.renew:
            self._leases_renewed(done.renew, done.renewed)
        for job in done.claimed:
            if self.stopping:
                # Claimed as the stop came: it goes back without starting.
                self._busy_slots -= 1
                self._to_write.append(returned(job))
            else:
                self._start(job)
        # Claims keep their queues' rows fresh for the queue cleaner, every few seconds.
        self._queues_to_touch.extend(
            due_for_touch(self._queues_touched_at, {job.queue for job in done.claimed})
        )

    def _collect_finished(self) -> None:
        while self._finished:
            running, outcome = self._finished.popleft()
            self._busy_slots -= 1
            if running.started_at is not None:
                took = time.monotonic() - running.started_at
                self._run_seconds = (
                    took
                    if self._run_seconds is None
                    else self._run_seconds + RUN_TIME_WEIGHT * (took - self._run_seconds)
                )
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
                self._to_write.append(outcome)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for running in self._running.values():
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
                self._to_write.append(cancelled(outcome) if running.cancel.requested else outcome)

    def _stuck_handlers(self) -> list[RunningJob]:
        """The handlers still running ``STUCK_GRACE_SECONDS`` after their timeout, their jobs'
        outcomes already recorded; each is logged once (a WARNING) while some slot is free."""
        now = time.monotonic()
        stuck = sorted(
            (
                running
                for running in self._overrun
                if _seconds_over(running, now) >= STUCK_GRACE_SECONDS
                and self._running.get(running.job.id) is not running
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
                        _seconds_over(running, now),
                        len(stuck),
                        self.id,
                        self.concurrency,
                    )
        return stuck

    def _give_up(self, stuck: list[RunningJob]) -> None:
        """Every slot is stuck: this worker can run nothing more, so it stops, to be replaced."""
        now = time.monotonic()
        self.exit_code = STUCK_EXIT_CODE
        logger.error(
            "eddyq worker %s: all %d of its slots are held by handlers still running past their "
            "timeouts (%s), so it can run no job; stopping, to exit with status %d and be "
            "replaced by a new process",
            self.id,
            self.concurrency,
            ", ".join(
                f"job {running.job.id} ({running.job.task}) {_seconds_over(running, now):.1f}s over"
                for running in stuck
            ),
            STUCK_EXIT_CODE,
        )
        self.stop()

    def _outcomes_written(self, outcomes: list[Outcome], written: set[int]) -> None:
        for outcome in outcomes:
            self._running.pop(outcome.job.id, None)
            self.processed += 1
            self._log_outcome(outcome, written=outcome.job.id in written)

    def _log_outcome(self, outcome: Outcome, *, written: bool) -> None:
        job = outcome.job
        if not written:
            logger.info(
                "eddyq job %s (%s): outcome %s discarded, the job is no longer this worker's "
                "(its lease expired and it was rescued, or it was cancelled)",
                job.id,
                job.task,
                outcome.summary,
            )
        elif outcome.state == "retryable":
            logger.warning(
                "eddyq job %s (%s) failed attempt %d of %d, retrying in %.1fs: %s",
                job.id,
                job.task,
                job.attempt,
                job.max_attempts,
                outcome.delay,
                outcome.summary,
            )
        elif outcome.state == "failed":
            logger.warning(
                "eddyq job %s (%s) failed for good after attempt %d of %d: %s",
                job.id,
                job.task,
                job.attempt,
                job.max_attempts,
                outcome.summary,
            )

    def _leases_renewed(self, held: list[int], rows: list[tuple[int, bool]]) -> None:
        renewed = {job_id for job_id, _ in rows}
        self._cancel_requests.extend(job_id for job_id, cancelled in rows if cancelled)
        self._apply_cancel_requests()
        for job_id in held:
            if job_id in renewed:
                continue
            running = self._running.pop(job_id)
            running.settled = True
            if self._take_back(job_id) is not None:
                logger.warning(
                    "eddyq job %s (%s) is no longer this worker's: its lease was lost before "
                    "it started; it will not run here",
                    job_id,
                    running.job.task,
                )
                continue
            # As for a cancelled job: a handler that checks cancel_requested() stops early.
            self._request_cancel(running)
            logger.warning(
                "eddyq job %s (%s) is no longer this worker's: its lease was lost; its handler "
                "is asked to stop, and its result will be discarded",
                job_id,
                running.job.task,
            )

    def _claim_room(self) -> int:
        """How many jobs a claim may take now: the free slots, and while jobs finish quickly,
        some to start as soon as slots free up."""
        ahead = 0
        if self._run_seconds is not None:
            pace = self.concurrency * CLAIM_AHEAD_SECONDS / max(self._run_seconds, 1e-6)
            ahead = min(self.concurrency * CLAIM_AHEAD_FACTOR, int(pace))
        return self.concurrency + ahead - self._busy_slots

    def _take_back(self, job_id: int) -> RunningJob | None:
        """The job, if no handler thread has started it yet, which now none will."""
        running = self._ready.pop(job_id, None)
        if running is not None:
            running.settled = True
            self._busy_slots -= 1
        return running

    def _ready_max_wait(self) -> float:
        return STOPPING_READY_MAX_WAIT_SECONDS if self.stopping else READY_MAX_WAIT_SECONDS

    def _return_ready(self, waited: float = 0.0) -> None:
        """Jobs not yet started, queued at least ``waited`` seconds ago, go back to available,
        their attempt given back."""
        queued_before = time.monotonic() - waited
        for job_id, running in list(self._ready.items()):
            if running.queued_at <= queued_before and self._take_back(job_id) is not None:
                self._to_write.append(returned(running.job))
                # The recent pace no longer holds (long jobs hold the slots): claim no more
                # ahead until jobs finish again.
                self._run_seconds = None

    def _start(self, job: ClaimedJob) -> None:
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
        self._running[job.id] = running
        self._ready[job.id] = running
        self._work.put(running)

    def _fail_at_once(self, job: ClaimedJob, outcome: Outcome) -> None:
        """A claimed job that cannot start ends with ``outcome``, as if its handler had run."""
        running = RunningJob(job, None, None)
        self._running[job.id] = running
        self._finished.append((running, outcome))

    # Handler side: runs on handler threads and the event loop thread.
    def _handler_thread(self) -> None:
        """Runs jobs one at a time: a thread is a slot, for async handlers too (it waits for
        the event loop to run them), so that ``concurrency`` bounds both."""
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
                return
            if self._ready.pop(running.job.id, None) is None:
                continue  # taken back before it started: stopping, cancelled, lease lost
            handler = running.handler
            assert handler is not None
            running.started_at = time.monotonic()
            if handler.timeout is not None:
                running.deadline = running.started_at + handler.timeout
            if handler.is_async:
                outcome = self._run_on_event_loop(running, handler)
            else:
                token = current_flag.set(running.cancel)
                try:
                    outcome = run_sync(running.job, handler, connections_checked)
                finally:
                    current_flag.reset(token)
            self._finished.append((running, outcome))
            self.wake()

    def _run_on_event_loop(self, running: RunningJob, handler: Handler) -> Outcome:
        assert self._event_loop is not None
        done = asyncio.run_coroutine_threadsafe(
            _run_async_job(running, run_async(running.job, handler)), self._event_loop
        )
        running.future = done
        wait_until_done([done])
        # A cancelled future or a BaseException from the handler still ends as an outcome.
        error = asyncio.CancelledError() if done.cancelled() else done.exception()
        return failure(running.job, handler, error) if error else done.result()

    def _on_control_notification(self, payload: str) -> None:
        kind, _, job_id = payload.partition(":")
        if kind == "cancel" and job_id.isdigit():
            self._cancel_requests.append(int(job_id))
            self.wake()

    def _apply_cancel_requests(self) -> None:
        while self._cancel_requests:
            job_id = self._cancel_requests.popleft()
            waiting = self._take_back(job_id)
            if waiting is not None:
                self._to_write.append(cancelled(returned(waiting.job)))
                logger.info(
                    "eddyq job %s (%s): cancelled before it started", job_id, waiting.job.task
                )
                continue
            running = self._running.get(job_id)
            if running is None or running.settled or running.cancel.requested:
                continue
            self._request_cancel(running)
            logger.info("eddyq job %s (%s): cancel requested", running.job.id, running.job.task)

    def _request_cancel(self, running: RunningJob) -> None:
        """Raise the job's cancel flag; an async handler's task is cancelled too (the
        CancelledError is raised inside it, and one that catches it and returns anyway
        still completes)."""
        running.cancel.requested = True
        if running.task is not None and self._event_loop is not None:
            self._event_loop.call_soon_threadsafe(running.task.cancel)

    def _on_jobs_notification(self, queue_name: str) -> None:
        if self.queues is None or queue_name in self.queues:
            self._jobs_notified = True
            self.wake()

    def _recover_stale(self) -> None:
        """One rescue pass over all queues at start-up, leader or not; one that fails is
        logged, and the worker starts anyway (the leader's rescuer will try again)."""
        try:
            rescued = Rescuer().run_once()
        except Exception:
            logger.exception(
                "eddyq worker %s: the start-up rescue failed; starting anyway", self.id
            )
            return
        finally:
            connections[eddyq_settings.DATABASE].close()
        if rescued:
            logger.info("eddyq worker %s: rescued %d stale jobs at start-up", self.id, rescued)

    # Helpers.
    def _reconnect(self, error: Exception) -> None:
        logger.warning("eddyq worker %s lost its database connection: %s", self.id, error)
        wait = RECONNECT_FIRST_SECONDS
        while True:
            if self._connection is not None:
                self._connection.close()
            try:
                self._connection = passes.connect()
                # The pass whose reply was lost may have claimed jobs this worker never saw.
                self._hand_back_strays()
            except DATABASE_UNREACHABLE:
                if self.stopping and self._past_drain_deadline():
                    raise
                time.sleep(wait)
                wait = min(wait * 2, RECONNECT_MAX_SECONDS)
                continue
            except Exception:
                logger.exception("eddyq worker %s: handing back lost claims failed", self.id)
            logger.info("eddyq worker %s reconnected to the database", self.id)
            return

    def _hand_back_unfinished(self) -> None:
        """At the end: jobs not yet started go back to available, their attempt not counted;
        async handlers still running are cancelled, and handed back once they have ended. A
        sync handler cannot be stopped: its job is left running, for the rescuer to retry
        once its lease expires (the attempt counted), after this process has ended."""
        if self._in_flight is not None:
            # Only after giving up on stuck handlers: the pass ends, what it claimed goes back.
            wait_until_done([self._in_flight[1]])
            try:
                done = self._committed_pass()
            except psycopg.Error as error:
                logger.warning("eddyq worker %s: its last pass failed: %s", self.id, error)
            else:
                if done is not None:
                    self._act_on(done)
        self._collect_finished()
        self._return_ready()
        self._interrupt_async_handlers()
        self._collect_finished()
        for running in self._running.values():
            if running.settled:
                continue
            running.settled = True
            if running.cancel.requested:
                self._to_write.append(cancelled(returned(running.job)))
                continue
            self.abandoned.append(running.job.id)
            logger.warning(
                "eddyq job %s (%s) still runs at the end of the shutdown timeout: left to the "
                "rescuer, which retries it once its lease expires",
                running.job.id,
                running.job.task,
            )
        for outcome in self._to_write:
            if outcome.state == "available":
                logger.warning(
                    "eddyq job %s (%s) did not finish before shutdown: handed back",
                    outcome.job.id,
                    outcome.job.task,
                )
        if not self._to_write:
            return
        last = Pass(outcomes=self._to_write, renew=[], promote=False, claim=0, touch=[])
        self._to_write = []
        try:
            self._act_on(self._run_pass(last))
        except psycopg.Error:
            logger.exception(
                "eddyq worker %s could not record its last outcomes; the rescuer will retry "
                "those jobs when their leases expire",
                self.id,
            )

    def _interrupt_async_handlers(self) -> None:
        """Cancel the async handlers still running, and give them a moment to end: each that
        ends is handed back (see ``_collect_finished``)."""
        interrupted = [
            running
            for running in self._running.values()
            if not running.settled and running.future is not None
        ]
        for running in interrupted:
            running.interrupted = True
            assert running.future is not None
            running.future.cancel()
        deadline = time.monotonic() + EVENT_LOOP_STOP_SECONDS
        while time.monotonic() < deadline and not all(running.settled for running in interrupted):
            self.wait(deadline - time.monotonic())
            self._collect_finished()

    def _idle(self) -> bool:
        return (
            self._in_flight is None
            and not self._running
            and not self._finished
            and not self._to_write
            and not self._claim_more
        )

    def _past_drain_deadline(self) -> bool:
        return self._drain_deadline is not None and time.monotonic() >= self._drain_deadline

    def _next_wait(self) -> float:
        now = time.monotonic()
        if self._in_flight is not None:
            # Its end wakes this thread; what it will do next waits for it.
            wait = self.interval()
        elif self._finished or self._to_write or self._queues_to_touch or self._wants_to_claim(now):
            return 0.0
        else:
            wait = max(self._next_heartbeat - now, 0.0)
            if not self.stopping and self._claim_room() > 0:
                wait = min(wait, max(self._next_poll - now, 0.0))
            if self.stopping and self._drain_deadline is not None:
                wait = min(wait, max(self._drain_deadline - now, 0.0))
        if self._ready:
            oldest = next(iter(self._ready.values())).queued_at
            wait = min(wait, max(oldest + self._ready_max_wait() - now, 0.0))
        for running in self._running.values():
            if running.deadline is not None and not running.settled:
                wait = min(wait, max(running.deadline - now, 0.0))
        for running in self._overrun:
            # When it will count as stuck (a wait of 0 once it does would spin).
            if running.deadline is not None and running.deadline + STUCK_GRACE_SECONDS > now:
                wait = min(wait, running.deadline + STUCK_GRACE_SECONDS - now)
        return wait

    @staticmethod
    def _heartbeat_seconds() -> float:
        return eddyq_settings.HEARTBEAT_INTERVAL.total_seconds()

    @staticmethod
    def _lease_seconds() -> float:
        return eddyq_settings.STALE_AFTER.total_seconds()


def _seconds_over(running: RunningJob, now: float) -> float:
    """How long a job has run past its timeout (0 without one)."""
    return 0.0 if running.deadline is None else now - running.deadline


def run_in_this_process(worker: Worker) -> None:
    """Run ``worker`` as this process's worker: once it gave up on stuck handlers
    (``Worker.exit_code``), or stopped with handlers still running (``Worker.abandoned``), the
    process ends at once, before any of their jobs can be retried elsewhere."""
    worker.run()
    if worker.exit_code or worker.abandoned:
        _exit_process(worker.exit_code)


def _exit_process(code: int) -> NoReturn:
    """End this process at once with status ``code``, skipping the interpreter's shutdown,
    which joins thread pools' threads: a stuck handler may be holding one forever."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


async def _run_async_job(running: RunningJob, run: Coroutine[Any, Any, Outcome]) -> Outcome:
    current_flag.set(running.cancel)  # in the task's own context
    running.task = asyncio.current_task()
    return await run


def _writing(outcome: Outcome) -> Pass:
    """A pass that writes ``outcome`` alone."""
    return Pass(outcomes=[outcome], renew=[], promote=False, claim=0, touch=[])


def claim_limit(room: int) -> int:
    """``room`` rounded down to its four leading binary digits (by at most an eighth): the limit
    is part of the claim's text, and this bounds how many texts a worker prepares."""
    drop = max(room.bit_length() - 4, 0)
    return room >> drop << drop
