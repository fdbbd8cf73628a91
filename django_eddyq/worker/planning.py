"""Planning the worker's passes, and acting on what each committed.

A pass writes the outcomes collected since the last one, renews the running jobs' leases when a
heartbeat is due, claims jobs when there is room (``pacing``) and keeps the rows of the queues it
claims from fresh. Once it has committed, the jobs it claimed are started (``slots``) and the
leases it could not renew given up. A pass the database refused is written again one outcome at
a time, so that only the job whose outcome it refuses fails.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import wait as wait_until_done
from typing import Any

import psycopg

from django_eddyq import metrics
from django_eddyq.conf import eddyq_settings
from django_eddyq.enqueue import due_for_touch
from django_eddyq.lifecycle import DATABASE_UNREACHABLE
from django_eddyq.signals import job_finished, send
from django_eddyq.vocabulary import JobState
from django_eddyq.worker.execution import Outcome, not_stored, returned
from django_eddyq.worker.pacing import Pacing, ready_max_wait
from django_eddyq.worker.passes import Pass, PassRunner
from django_eddyq.worker.recycling import Recycling
from django_eddyq.worker.slots import Slots

logger = logging.getLogger(__name__)


class Planner:
    """What the worker's next pass sends, and what a pass that committed means for the worker.

    Only the worker's main thread uses it.
    """

    def __init__(
        self,
        *,
        worker_id: str,
        burst: bool,
        interval: Callable[[], float],
        stopping: Callable[[], bool],
        hurried: Callable[[], bool],
        runner: PassRunner,
        slots: Slots,
        pacing: Pacing,
        recycling: Recycling,
        signal_sender: type,
        seen: Callable[[], dict[str, Any]],
    ) -> None:
        self.worker_id = worker_id
        self._signal_sender = signal_sender  # the Worker class, as the job signals' sender
        self._seen = seen  # the worker's row in the registry, as it is now
        self.burst = burst
        self._interval = interval  # the worker's poll interval
        self._stopping = stopping  # whether the worker is stopping: then it claims no more
        # Whether it was told to stop, not only to make way for a fresh process: then the jobs
        # it claimed ahead go back at once instead of running first.
        self._hurried = hurried
        self._runner = runner
        self._slots = slots
        self._pacing = pacing
        self._recycling = recycling
        self._queues_touched_at: dict[str, float] = {}
        self._queues_to_touch: list[str] = []
        self._to_write: list[Outcome] = []
        self._next_heartbeat = 0.0
        # Jobs whose outcome the database refused to store in any form: never handed back
        # (their handler ran), they wait for their lease to expire.
        self._left_to_rescuer: set[int] = set()
        self.processed = 0
        # Of the outcomes stored: attempts that ended, and jobs handed back unstarted.
        self.finished = 0
        self.handed_back = 0

    def start_heartbeats(self) -> None:
        """The first heartbeat goes with the first pass: it registers the worker."""
        self._next_heartbeat = time.monotonic()

    def run_once(self) -> int:
        """Act on the pass in flight once it has committed; plan and send the next one.

        The next pass goes to the database thread before the jobs the last one claimed are
        started, so that the database runs it while this thread starts them; with nothing to
        do meanwhile, this thread runs it itself (a job waiting alone starts sooner). What a
        pass means for this worker (jobs started, outcomes written, leases given up) is acted
        on only once it has committed. Returns the rows the pass acted on changed.
        """
        slots = self._slots
        self._to_write += slots.apply_cancel_requests()
        self._to_write += slots.collect_finished()
        self._to_write += slots.return_ready(waited=ready_max_wait(self._hurried()))
        self._to_write += slots.check_deadlines()
        done = self._committed_pass()
        if self._runner.in_flight is None and (planned := self._plan()) is not None:
            self._runner.send(planned, here=done is None)
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
        ended = self._runner.ended()
        if ended is None:
            return None
        planned, result = ended
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
        self._pacing.claimed(done.claim, len(done.claimed), took=time.monotonic() - done.sent_at)
        return done

    def _recover_from(self, failed: Pass, error: Exception) -> None:
        """After a pass that failed for a reason other than the connection, and so wrote
        nothing: its outcomes are written one at a time, so that only a job whose outcome the
        database refuses fails (saying why), and the rest of the pass runs again later."""
        logger.error(
            "eddyq worker %s: a pass failed (%s: %s); writing its %d outcomes one at a time",
            self.worker_id,
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
            self._pacing.claim_failed()
            # Its results may have failed after it committed.
            self.hand_back_strays()

    def _write_alone(self, outcome: Outcome) -> None:
        """Write ``outcome`` in a pass of its own; if the database refuses it, fail its job with
        an error entry saying why; if even that is refused, leave the job to the rescuer."""
        try:
            self._act_on(self._runner.run(_writing(outcome)))
            return
        except DATABASE_UNREACHABLE:
            raise
        except Exception as error:
            set_aside = not_stored(outcome, error)
        try:
            self._act_on(self._runner.run(_writing(set_aside)))
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
            self._slots.running.pop(job.id, None)
            self._left_to_rescuer.add(job.id)

    def hand_back_strays(self) -> None:
        """Jobs claimed by a pass whose reply never came go back (see ``PassRunner``)."""
        self._runner.hand_back_strays(
            [
                *self._slots.running,
                *(outcome.job.id for outcome in self._to_write),
                *self._left_to_rescuer,
            ]
        )

    def _plan(self) -> Pass | None:
        """The next pass: what finished, a heartbeat when due, a claim when there is room."""
        now = time.monotonic()
        renew: list[int] = []
        seen = None
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + _heartbeat_seconds()
            renew = [
                job_id for job_id, running in self._slots.running.items() if not running.settled
            ]
            seen = self._seen()
        claim = self._recycling.cap(self._pacing.next_claim()) if self._wants_to_claim(now) else 0
        planned = Pass(
            outcomes=self._to_write,
            renew=renew,
            # A burst worker promotes due jobs itself, but only once the available ones run
            # short: not a statement in every pass.
            promote=self.burst and claim > 0 and not self._pacing.claim_more,
            claim=claim,
            touch=self._queues_to_touch,
            seen=seen,
        )
        if planned.is_empty():
            return None
        self._to_write, self._queues_to_touch = [], []
        return planned

    def _wants_to_claim(self, now: float) -> bool:
        return (
            not self._stopping()
            and self._recycling.may_take()
            and self._pacing.wants_to_claim(now, outcomes_to_write=bool(self._to_write))
        )

    def _act_on(self, done: Pass) -> None:
        """What a committed pass means for this worker."""
        if done.outcomes:
            self._outcomes_written(done.outcomes, done.written)
        if done.renew:
            self._leases_renewed(done.renew, done.renewed)
        for job in done.claimed:
            if self._stopping():
                # Claimed as the stop came: it goes back without starting.
                self._pacing.held -= 1
                self._to_write.append(returned(job))
            else:
                self._recycling.taken += 1
                self._slots.start(job)
        # Claims keep their queues' rows fresh for the queue cleaner, every few seconds.
        self._queues_to_touch.extend(
            due_for_touch(self._queues_touched_at, {job.queue for job in done.claimed})
        )

    def _outcomes_written(self, outcomes: list[Outcome], written: set[int]) -> None:
        running = self._slots.running
        for outcome in outcomes:
            running.pop(outcome.job.id, None)
            self.processed += 1
            stored = outcome.job.id in written
            if stored:
                if outcome.state == JobState.AVAILABLE:
                    self.handed_back += 1
                else:
                    self.finished += 1
                send(
                    job_finished,
                    self._signal_sender,
                    job=outcome.job,
                    outcome=outcome.kind,
                    duration=outcome.duration,
                    exception=outcome.exception,
                    worker_id=self.worker_id,
                )
                if metrics.recording:
                    metrics.job_finished(outcome.job, outcome.kind, outcome.duration)
            log_outcome(outcome, written=stored, worker_id=self.worker_id)

    def _leases_renewed(self, held: list[int], rows: list[tuple[int, bool]]) -> None:
        renewed = {job_id for job_id, _ in rows}
        self._to_write += self._slots.apply_cancel_requests(
            job_id for job_id, cancelled in rows if cancelled
        )
        for job_id in held:
            if job_id not in renewed:
                self._slots.lost(job_id)

    # Stopping.
    def end_in_flight(self) -> None:
        """The pass in flight, if any, ends; what it claimed goes back."""
        if self._runner.in_flight is None:
            return
        wait_until_done([self._runner.in_flight[1]])
        try:
            done = self._committed_pass()
        except psycopg.Error as error:
            logger.warning("eddyq worker %s: its last pass failed: %s", self.worker_id, error)
        else:
            if done is not None:
                self._act_on(done)

    def write_last(self, handed_back: list[Outcome]) -> None:
        """The outcomes left to write, and those of the jobs handed back, in one last pass."""
        self._to_write += handed_back
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
            self._act_on(self._runner.run(last))
        except psycopg.Error:
            logger.exception(
                "eddyq worker %s could not record its last outcomes; the rescuer will retry "
                "those jobs when their leases expire",
                self.worker_id,
            )

    # Waiting.
    def idle(self) -> bool:
        return (
            self._runner.in_flight is None
            and not self._slots.running
            and not self._slots.finished
            and not self._to_write
            and not self._pacing.claim_more
        )

    def next_wait(self, drain_deadline: float | None) -> float:
        """How long the worker may wait before its next pass, stopping by ``drain_deadline``."""
        now = time.monotonic()
        stopping = self._stopping()
        if self._runner.in_flight is not None:
            # Its end wakes this thread; what it will do next waits for it.
            wait = self._interval()
        elif (
            self._slots.finished
            or self._to_write
            or self._queues_to_touch
            or self._wants_to_claim(now)
        ):
            return 0.0
        else:
            wait = max(self._next_heartbeat - now, 0.0)
            if not stopping and self._pacing.room() > 0:
                wait = min(wait, max(self._pacing.next_poll - now, 0.0))
            if stopping and drain_deadline is not None:
                wait = min(wait, max(drain_deadline - now, 0.0))
        return min(wait, self._slots.next_wait(now, ready_max_wait(self._hurried())))


def log_outcome(outcome: Outcome, *, written: bool, worker_id: str) -> None:
    """What became of an outcome a pass wrote: discarded (the job is no longer the worker's),
    a failure to be retried (WARNING), or a last failure (ERROR); both failures with their
    traceback, and the job's fields in ``extra`` for structured logs."""
    job = outcome.job
    if not written:
        logger.info(
            "eddyq job %s (%s): outcome %s discarded, the job is no longer this worker's "
            "(its lease expired and it was rescued, or it was cancelled)",
            job.id,
            job.task,
            outcome.summary,
        )
        return
    if outcome.state not in ("retryable", "failed"):
        return
    extra = {
        "eddyq_job_id": job.id,
        "eddyq_task": job.task,
        "eddyq_queue": job.queue,
        "eddyq_attempt": job.attempt,
        "eddyq_max_attempts": job.max_attempts,
        "eddyq_worker_id": worker_id,
    }
    if outcome.state == "retryable":
        logger.warning(
            "eddyq job %s (%s) failed attempt %d of %d, retrying in %.1fs: %s",
            job.id,
            job.task,
            job.attempt,
            job.max_attempts,
            outcome.delay,
            outcome.summary,
            exc_info=outcome.exception,
            extra=extra,
        )
    else:
        logger.error(
            "eddyq job %s (%s) failed for good after attempt %d of %d: %s",
            job.id,
            job.task,
            job.attempt,
            job.max_attempts,
            outcome.summary,
            exc_info=outcome.exception,
            extra=extra,
        )


def _heartbeat_seconds() -> float:
    return eddyq_settings.HEARTBEAT_INTERVAL.total_seconds()


def _writing(outcome: Outcome) -> Pass:
    """A pass that writes ``outcome`` alone."""
    return Pass(outcomes=[outcome], renew=[], promote=False, claim=0, touch=[])
