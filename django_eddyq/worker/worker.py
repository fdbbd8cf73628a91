"""The worker: one process's job loop, from start to graceful stop.

The ``Worker`` starts and stops its parts, repeats its passes until it is stopped, reconnects
after losing its database connection, gives up when every slot is stuck, and hands back what it
has not finished at the end. Its parts: the ``Planner`` (``planning``) plans each pass and acts on
what it committed; the ``PassRunner`` (``passes``) runs the passes on the worker's own connection;
the ``Slots`` (``slots``) run the handlers; the ``Pacing`` (``pacing``) says how many jobs to claim;
the ``Recycling`` (``recycling``) says when the process should make way for a fresh one.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NoReturn

from django.db import connections

from django_eddyq import __version__, registry, sql
from django_eddyq.arguments import dumps
from django_eddyq.conf import eddyq_settings
from django_eddyq.election import Elector
from django_eddyq.lifecycle import DATABASE_UNREACHABLE, PERSISTENT_OUTAGE_SECONDS, Loop
from django_eddyq.listener import Listener
from django_eddyq.maintenance import Rescuer, all_services
from django_eddyq.operations import apply_configured_limits
from django_eddyq.signals import send, worker_started, worker_stopping
from django_eddyq.vocabulary import validate_queue_name
from django_eddyq.worker.execution import RunningJob
from django_eddyq.worker.pacing import Pacing
from django_eddyq.worker.passes import PassRunner
from django_eddyq.worker.planning import Planner
from django_eddyq.worker.recycling import Recycling
from django_eddyq.worker.slots import Slots

logger = logging.getLogger(__name__)

# Reconnection waits grow from this, doubling, up to the cap.
RECONNECT_FIRST_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 10.0
# How a worker process ends when every one of its slots is stuck (EX_TEMPFAIL: start me again).
STUCK_EXIT_CODE = 75
# The longest the first claim holds back the start-up rescue and the election (see
# Worker._start_deferred): a first claim that waits (on a lock, for a slow server) must not keep
# the worker out of the election.
DEFERRED_START_MAX_SECONDS = 1.0


def make_worker_id() -> str:
    """Unique per process and start: host, pid and a random suffix (pids get reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker(Loop):
    """One worker process's job loop.

    The main thread owns all bookkeeping; handler threads only take queued jobs and hand back
    outcomes (see ``Slots``); the database thread runs the passes the main thread plans, on
    the worker's own connection, one at a time (see ``PassRunner``). Each pass writes the
    finished jobs in one statement, renews leases when due, then claims as many jobs as there
    are free slots (and, while its jobs finish quickly, a few more: see ``Pacing``), all in one
    transaction (see ``Planner``).
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
        max_jobs: int | None = None,
        max_memory_mib: int | None = None,
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

        self._listener: Listener | None = None
        self._runner = PassRunner(worker_id=self.id, queues=self.queues, wake=self.wake)
        self._pacing = Pacing(concurrency, poll_interval=self.interval)
        self._recycling = Recycling(max_jobs=max_jobs, max_memory_mib=max_memory_mib)
        self._slots = Slots(
            concurrency=concurrency,
            worker_id=self.id,
            pacing=self._pacing,
            wake=self.wake,
            signal_sender=type(self),
        )
        self._planner = Planner(
            worker_id=self.id,
            burst=burst,
            interval=self.interval,
            stopping=self._stopping.is_set,
            hurried=lambda: self._hurried,
            runner=self._runner,
            slots=self._slots,
            pacing=self._pacing,
            recycling=self._recycling,
            signal_sender=type(self),
            seen=self._registry_row,
        )
        self._drain_deadline: float | None = None
        # Told to stop (not recycled, which runs what it claimed ahead before it stops).
        self._hurried = False
        # What waits for the first claim (see _start_deferred): whether it has started (or
        # never will: the worker stopped first), the timer that starts it if that claim is
        # slow, the start-up rescue's thread and how many jobs it rescued.
        self._deferred_lock = threading.RLock()  # RLock: stop() may run in a signal handler
        self._deferred_started = False
        self._deferred_timer: threading.Timer | None = None
        self._recovery: threading.Thread | None = None
        self._rescued_at_start = 0
        self._stopping_announced = False  # worker_stopping was sent
        # 0, or STUCK_EXIT_CODE once the worker gave up because every slot was stuck: the
        # process should exit with it (see run_in_this_process), to be replaced.
        self.exit_code = 0
        # The jobs whose handlers were still running when the worker stopped, left to the
        # rescuer: their process must end at once (see run_in_this_process).
        self.abandoned: list[int] = []
        # Why the worker stopped to be replaced by a fresh process, if it did (see recycle).
        self.recycled: str | None = None

    # Lifecycle.
    def on_start(self) -> None:
        """What the first claim needs: the tasks, the connection, the queues' limits, the
        listener and the threads. The rest waits for it (see ``_start_deferred``)."""
        registry.discover()
        self._runner.connect()
        if eddyq_settings.QUEUES:
            apply_configured_limits()
        listener = Listener() if eddyq_settings.LISTEN_NOTIFY else None
        if listener is not None:
            listener.subscribe(sql.JOBS_CHANNEL, self._on_jobs_notification)
            listener.subscribe(sql.CONTROL_CHANNEL, self._slots.on_control_notification)
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
        self._runner.start_thread()
        self._slots.start_threads()
        self._planner.start_heartbeats()
        # The system checks' connection, if they opened one: this thread runs no statement of
        # its own from here on, and an idle connection holds a server process.
        connections[eddyq_settings.DATABASE].close()
        self._deferred_timer = threading.Timer(DEFERRED_START_MAX_SECONDS, self._start_deferred)
        self._deferred_timer.daemon = True
        self._deferred_timer.start()
        logger.info(
            "eddyq worker %s started: queues %s, concurrency %d%s",
            self.id,
            ", ".join(self.queues) if self.queues else "all",
            self.concurrency,
            ", burst" if self.burst else "",
        )
        send(worker_started, type(self), worker=self)

    def _start_deferred(self) -> None:
        """Start, once, what the first claim need not wait for: the start-up rescue, on a
        thread of its own, and the election (with the maintenance services of a leader), whose
        connections and passes would otherwise compete with that claim for the server and this
        process. Called once the first pass has committed and its jobs have started, or by the
        timer after ``DEFERRED_START_MAX_SECONDS``, whichever comes first; never after a stop."""
        with self._deferred_lock:
            if self._deferred_started:
                return
            self._deferred_started = True
            if eddyq_settings.RECOVER_STALE_ON_START:
                self._recovery = threading.Thread(
                    target=self._recover_stale, name="eddyq-recovery", daemon=True
                )
                self._recovery.start()
            if self.elector is not None:
                self.elector.start()

    def _cancel_deferred(self) -> None:
        """What has not started yet never will: the worker is stopping."""
        with self._deferred_lock:
            self._deferred_started = True

    def on_stop(self) -> None:
        self._cancel_deferred()
        if self._deferred_timer is not None:
            self._deferred_timer.cancel()
            self._deferred_timer.join()
        if self._recovery is not None:
            self._recovery.join()
        if self.elector is not None:
            self.elector.stop()
            self.elector.join()
        if self._listener is not None:
            self._listener.stop()
        self._runner.stop_thread()
        self._slots.stop_threads()
        self._runner.close()
        logger.info("eddyq worker %s stopped after %d jobs", self.id, self.processed)

    def stop(self) -> None:
        """Stop claiming; running jobs get ``shutdown_timeout`` seconds to finish, and those
        claimed ahead that no handler has started go back at once."""
        self._hurried = True
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.shutdown_timeout
            self._announce_stopping()
        self._cancel_deferred()
        # Leadership is handed over at once, not after the drain.
        if self.elector is not None:
            self.elector.stop()
        super().stop()

    def recycle(self, reason: str, *, within: float | None = None) -> None:
        """Take no more jobs and stop once those held have ended, to be replaced by a fresh
        process; ``within`` bounds the wait as ``shutdown_timeout`` bounds a stop's, and a stop
        meanwhile bounds it by ``shutdown_timeout``."""
        if self.stopping:
            return
        self.recycled = reason
        logger.info(
            "eddyq worker %s: %s; taking no more jobs, and stopping once its %d running jobs "
            "have ended, to be replaced",
            self.id,
            reason,
            len(self._slots.running),
        )
        if within is not None:
            self._drain_deadline = time.monotonic() + within
        self._announce_stopping()
        self._cancel_deferred()
        if self.elector is not None:
            self.elector.stop()
        super().stop()

    def interval(self) -> float:
        return eddyq_settings.POLL_INTERVAL.total_seconds()

    def run(self) -> None:
        self.on_start()
        first_pass = True
        try:
            while True:
                try:
                    self.run_once()
                    if first_pass:
                        first_pass = False
                        self._start_deferred()
                except DATABASE_UNREACHABLE as error:
                    self._reconnect(error)
                    continue
                except Exception:
                    # A pass that fails is handled where it ends (in the Planner): this is a
                    # fault of the worker's own, which must not end it either.
                    logger.exception("eddyq worker %s: its loop failed; going on", self.id)
                    if self._past_drain_deadline():
                        break
                    self.wait(self.interval())
                    continue
                if not self.stopping:
                    stuck = self._slots.stuck()
                    if len(stuck) >= self.concurrency:
                        self._give_up(stuck)
                        break
                    if (reason := self._recycling.reason(self.finished)) is not None:
                        self.recycle(reason)
                if (
                    self.stopping
                    and self._runner.in_flight is None
                    and (not self._slots.running or self._past_drain_deadline())
                ):
                    break
                if self.burst and self._planner.idle() and not self._rescued_more():
                    break
                self.wait(self._planner.next_wait(self._drain_deadline))
            self._announce_stopping()  # a burst worker's work is done
            self._hand_back_unfinished()
        finally:
            self.on_stop()

    def _announce_stopping(self) -> None:
        if not self._stopping_announced:
            self._stopping_announced = True
            send(worker_stopping, type(self), worker=self)

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
                f"job {running.job.id} ({running.job.task}) {running.seconds_over(now):.1f}s over"
                for running in stuck
            ),
            STUCK_EXIT_CODE,
        )
        self.stop()

    def run_once(self, now: datetime | None = None) -> int:
        """One pass: see ``Planner.run_once``."""
        return self._planner.run_once()

    @property
    def processed(self) -> int:
        """How many jobs' outcomes this worker has written (or found were no longer its own)."""
        return self._planner.processed

    @property
    def finished(self) -> int:
        """How many attempts this worker ran to an end it stored."""
        return self._planner.finished

    @property
    def handed_back(self) -> int:
        """How many jobs this worker gave back unstarted (or interrupted by its own stop)."""
        return self._planner.handed_back

    def _registry_row(self) -> dict[str, Any]:
        """This worker's row in ``eddyq_workers``, as it is now."""
        return {
            "id": self.id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "queues": None if self.queues is None else dumps(self.queues),
            "concurrency": self.concurrency,
            "running": len(self._slots.running),
            "leader": self.elector is not None and self.elector.is_leader,
        }

    def _on_jobs_notification(self, queue_name: str) -> None:
        if self.queues is None or queue_name in self.queues:
            self._runner.jobs_notified(queue_name)
            self._pacing.jobs_notified = True
            self.wake()

    def _rescued_more(self) -> bool:
        """For a burst worker out of work: wait for the start-up rescue to end; True, once,
        if it rescued jobs, which the worker then looks for (a job due again at once is
        promoted and run, as if the rescue had come before the first claim)."""
        if self._recovery is None:
            return False
        self._recovery.join()
        self._recovery = None
        if not self._rescued_at_start:
            return False
        self._pacing.jobs_notified = True
        return True

    def _recover_stale(self) -> None:
        """One rescue pass over all queues at start-up, leader or not, on its own thread's
        connection; one that fails is logged, and the worker works on (the leader's rescuer
        will try again)."""
        try:
            rescued = Rescuer().run_once()
        except Exception:
            logger.exception(
                "eddyq worker %s: the start-up rescue failed; starting anyway", self.id
            )
            return
        finally:
            connections[eddyq_settings.DATABASE].close()
        self._rescued_at_start = rescued
        if rescued:
            logger.info("eddyq worker %s: rescued %d stale jobs at start-up", self.id, rescued)

    def _reconnect(self, error: Exception) -> None:
        logger.warning("eddyq worker %s lost its database connection: %s", self.id, error)
        wait = RECONNECT_FIRST_SECONDS
        lost_at = time.monotonic()
        reported = False
        tries = 0
        while True:
            try:
                tries += 1
                self._runner.connect()
                # The pass whose reply was lost may have claimed jobs this worker never saw.
                self._planner.hand_back_strays()
            except DATABASE_UNREACHABLE:
                if self.stopping and self._past_drain_deadline():
                    raise
                if not reported and time.monotonic() - lost_at >= PERSISTENT_OUTAGE_SECONDS:
                    reported = True
                    logger.error(
                        "eddyq worker %s: still cannot reach the database after %.0fs and %d "
                        "tries; trying on",
                        self.id,
                        time.monotonic() - lost_at,
                        tries,
                    )
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
        # Only after giving up on stuck handlers: the pass ends, what it claimed goes back.
        self._planner.end_in_flight()
        handed_back, self.abandoned = self._slots.hand_back(self.wait)
        self._planner.write_last(handed_back)

    def _past_drain_deadline(self) -> bool:
        return self._drain_deadline is not None and time.monotonic() >= self._drain_deadline


def run_in_this_process(
    worker: Worker,
    after: Callable[[Worker], None] | None = None,
    *,
    recycled_exit_code: int = 0,
) -> None:
    """Run ``worker`` as this process's worker, then ``after(worker)``: once it gave up on stuck
    handlers (``Worker.exit_code``), or stopped with handlers still running
    (``Worker.abandoned``), the process ends at once, before any of their jobs can be retried
    elsewhere. One that was recycled ends with ``recycled_exit_code``, which tells whoever
    started it to start another."""
    worker.run()
    if after is not None:
        after(worker)
    code = worker.exit_code or (recycled_exit_code if worker.recycled else 0)
    if code or worker.abandoned:
        _exit_process(code)


def _exit_process(code: int) -> NoReturn:
    """End this process at once with status ``code``, skipping the interpreter's shutdown,
    which joins thread pools' threads: a stuck handler may be holding one forever."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
