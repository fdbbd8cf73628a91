"""Claim-ahead pacing: how many jobs the worker's next claim may take, and when it claims.

While jobs finish quickly, a pass claims more jobs than the worker has free slots, so that one
commit serves more of them; handler threads take the next one as soon as they are free.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The extra jobs wait about this long at most at the recent pace of the worker's jobs (none are
# claimed ahead of slow jobs, so that other workers get them)...
CLAIM_AHEAD_SECONDS = 0.02
# ... or, when passes take longer (a server busy with many workers, a distant one), as long as
# this many recent passes, so that they last until the next pass is back with more; but not so
# long that a slow pass has one worker hold jobs that idle ones could run...
CLAIM_AHEAD_PASSES = 2
CLAIM_AHEAD_MAX_SECONDS = 0.25
# ... and never more than this many times its concurrency (a bound only for jobs of well under a
# millisecond). One that has not started after READY_MAX_WAIT_SECONDS (long jobs took every
# slot meanwhile) goes back to the queue.
CLAIM_AHEAD_FACTOR = 30
READY_MAX_WAIT_SECONDS = 1.0
# When told to stop (not when recycled), a job not started this long after it was queued goes
# back at once: a free thread takes a queued job up within a moment, so it is waiting for a slot.
STOPPING_READY_MAX_WAIT_SECONDS = 0.05
# How much each finished job moves the average run time (an exponential moving average).
RUN_TIME_WEIGHT = 0.2


class Pacing:
    """How many jobs the worker holds, how long they have taken lately, and when it next claims.

    Only the worker's main thread reads and writes it.
    """

    def __init__(self, concurrency: int, *, poll_interval: Callable[[], float]) -> None:
        self.concurrency = concurrency
        self._poll_interval = poll_interval  # the worker's
        # Claimed and not yet ended or handed back: running, or queued for a free slot.
        self.held = 0
        self.run_seconds: float | None = None  # the recent average, from start to collected
        self.pass_seconds = 0.0  # the recent average, from sent to committed and taken back
        # A claim that came back full: more jobs may be waiting. After one that came back
        # short, the next waits for a notification of new jobs, outcomes to write, or the poll
        # interval.
        self.claim_more = False
        self.jobs_notified = False
        self.next_poll = 0.0

    def room(self) -> int:
        """How many jobs a claim may take now: the free slots, and while jobs finish quickly,
        some to start as soon as slots free up."""
        ahead = 0
        if self.run_seconds is not None:
            by_passes = min(CLAIM_AHEAD_PASSES * self.pass_seconds, CLAIM_AHEAD_MAX_SECONDS)
            seconds = max(CLAIM_AHEAD_SECONDS, by_passes)
            pace = self.concurrency * seconds / max(self.run_seconds, 1e-6)
            ahead = min(self.concurrency * CLAIM_AHEAD_FACTOR, int(pace))
        return self.concurrency + ahead - self.held

    def wants_to_claim(self, now: float, *, outcomes_to_write: bool) -> bool:
        """Whether to claim: with room, when jobs may be waiting. A pass that writes outcomes
        claims after them, so that it sees what they made available (a batch's callback, a
        job a handler enqueued)."""
        return self.room() > 0 and (
            self.claim_more or self.jobs_notified or outcomes_to_write or now >= self.next_poll
        )

    def next_claim(self) -> int:
        """How many jobs the claim being planned asks for; it answers any notification."""
        self.jobs_notified = False
        return claim_limit(self.room())

    def claimed(self, asked: int, got: int, *, took: float) -> None:
        """A pass that asked for ``asked`` jobs (0: it did not claim) committed with ``got``,
        ``took`` seconds after it was sent."""
        self.held += got
        if asked:
            self.pass_seconds += RUN_TIME_WEIGHT * (took - self.pass_seconds)
            self.claim_more = got == asked
            if not self.claim_more:
                self.next_poll = time.monotonic() + self._poll_interval()

    def claim_failed(self) -> None:
        """The next claim waits for the poll interval, lest a claim that fails fail in a loop."""
        self.claim_more = False
        self.next_poll = time.monotonic() + self._poll_interval()

    def ran(self, seconds: float) -> None:
        """A job ran for ``seconds``, from its start until its outcome was collected."""
        average = self.run_seconds
        self.run_seconds = (
            seconds if average is None else average + RUN_TIME_WEIGHT * (seconds - average)
        )

    def pace_lost(self) -> None:
        """A job claimed ahead waited too long (long jobs hold the slots): the recent pace no
        longer holds, so claim no more ahead until jobs finish again."""
        self.run_seconds = None


def ready_max_wait(hurried: bool) -> float:
    """How long a job claimed ahead may wait for a slot before it goes back to the queue:
    ``hurried``, when the worker was told to stop."""
    return STOPPING_READY_MAX_WAIT_SECONDS if hurried else READY_MAX_WAIT_SECONDS


def claim_limit(room: int) -> int:
    """``room`` rounded down to its four leading binary digits (by at most an eighth): the limit
    is part of the claim's text, and this bounds how many texts a worker prepares."""
    drop = max(room.bit_length() - 4, 0)
    return room >> drop << drop
