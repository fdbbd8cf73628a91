"""Exceptions a handler raises to steer its job, and errors the queue reports."""

from __future__ import annotations

from datetime import timedelta


class Snooze(Exception):
    """Run the job again after ``seconds``, giving the attempt back and recording no error."""

    def __init__(self, seconds: float | timedelta) -> None:
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError(f"Snooze takes a non-negative number of seconds, not {seconds!r}")
        self.seconds = float(seconds)
        super().__init__(f"snoozed for {self.seconds:g}s")


class Discard(Exception):
    """Fail the job now, without further attempts, recording ``reason`` as its error."""

    def __init__(self, reason: str = "discarded by its task") -> None:
        self.reason = reason
        super().__init__(reason)


class TaskNotFound(ImportError):
    """A job names a task path that cannot be imported."""


class MalformedJob(TypeError):
    """A job's stored ``args`` are not a JSON array, or its ``kwargs`` not a JSON object: a row
    written by something other than enqueue, such as an edit by hand."""


class JobRescued(Exception):
    """The attempt's worker stopped renewing its lease; the rescuer took the job back."""
