"""The one start/stop/run-once shape shared by the worker, the elector and every service."""

from __future__ import annotations

import logging
import random
import threading
import time
from datetime import datetime

import django.db
import psycopg

logger = logging.getLogger(__name__)

# How long a loop waits after a failing pass grows from this, doubling, up to its interval.
FIRST_RETRY_SECONDS = 0.5
# A database unreachable this long is no passing blip but trouble to act on: an ERROR, once.
PERSISTENT_OUTAGE_SECONDS = 60.0
# Errors that mean the connection is gone rather than that the pass is wrong.
DATABASE_UNREACHABLE = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    django.db.OperationalError,
    django.db.InterfaceError,
)


class Loop:
    """Something that repeats a single pass until it is stopped.

    ``run_once(now=None)`` does one pass and returns how many rows it changed; ``run()`` repeats
    it with ``interval()`` seconds (plus a little jitter) between passes, logging a failing pass
    and trying again later instead of dying; ``start()`` runs that in a thread, ``stop()`` ends
    it, ``wake()`` cuts the current wait short.
    """

    name = "loop"
    jitter = 0.1  # Fraction of the interval, so that many processes don't tick in step.

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._woken = threading.Event()
        self._thread: threading.Thread | None = None
        self._outage_reported = False  # the ERROR of an outage that lasts, said once

    # What a subclass provides.
    def run_once(self, now: datetime | None = None) -> int:
        raise NotImplementedError

    def loop_pass(self) -> int:
        """The pass ``run()`` repeats: ``run_once()`` unless a subclass guards or logs it."""
        return self.run_once()

    def interval(self) -> float | None:
        """Seconds between passes; None means the loop is disabled."""
        raise NotImplementedError

    def next_delay(self, interval: float) -> float:
        """Seconds to wait after a pass that went well: the interval with a little jitter.

        A loop that knows when it is next needed (the scheduler, cron) returns that instead.
        """
        return interval * (1 + random.uniform(-self.jitter, self.jitter))

    def on_start(self) -> None:
        """Runs in the loop's thread before the first pass."""

    def on_stop(self) -> None:
        """Runs in the loop's thread after the last pass, even after an error."""

    def on_failure(self) -> None:
        """Runs after a pass that raised, before the wait (e.g. to drop a broken connection)."""

    # The shared lifecycle.
    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self.run, name=f"eddyq-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._woken.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the loop's thread to end; True if it has."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def wake(self) -> None:
        # Setting a set event still takes its lock; handler threads wake the worker per job.
        # Never lost: whoever clears it runs a pass after, which sees what the waker did first.
        if not self._woken.is_set():
            self._woken.set()

    def wait(self, seconds: float | None) -> None:
        """Sleep up to ``seconds`` (None: until woken), returning early when woken or stopped."""
        if self._woken.wait(seconds):
            self._woken.clear()

    def run(self) -> None:
        interval = self.interval()
        if interval is None:
            return
        self.on_start()
        failures = 0
        failing_since = 0.0
        try:
            while not self.stopping:
                try:
                    self.loop_pass()
                    if failures:
                        logger.info("eddyq %s: working again", self.name)
                    failures = 0
                    delay = self.next_delay(interval)
                except Exception as error:
                    failures += 1
                    if failures == 1:
                        failing_since = time.monotonic()
                    delay = min(interval, FIRST_RETRY_SECONDS * 2 ** (failures - 1))
                    self._log_failure(error, failures, delay, time.monotonic() - failing_since)
                    self.on_failure()
                if not self.stopping:
                    self.wait(delay)
        finally:
            self.on_stop()

    def _log_failure(self, error: Exception, failures: int, delay: float, for_: float) -> None:
        """A lost database connection is one WARNING until it is back, and one ERROR if it
        stays lost for ``PERSISTENT_OUTAGE_SECONDS``; a bug is an ERROR each time, with its
        traceback."""
        if not isinstance(error, DATABASE_UNREACHABLE):
            logger.exception("eddyq %s: pass failed; trying again in %.1fs", self.name, delay)
        elif failures == 1:
            logger.warning(
                "eddyq %s: the database is unreachable (%s); retrying with back-off",
                self.name,
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
            )
        elif for_ >= PERSISTENT_OUTAGE_SECONDS and not self._outage_reported:
            self._outage_reported = True
            logger.error(
                "eddyq %s: the database is still unreachable after %.0fs and %d tries",
                self.name,
                for_,
                failures,
            )
        if failures == 1:
            self._outage_reported = False
