"""Exceptions a handler raises to steer its job, and errors the queue reports."""

from __future__ import annotations

from datetime import timedelta

from django_eddyq.durations import delay_seconds


class Snooze(Exception):
    """Run the job again after ``seconds``, giving the attempt back and recording no error.

    ``seconds`` must be finite and zero or more (a ``ValueError`` otherwise, which fails the
    attempt that raised it); beyond ``durations.MAX_DELAY`` it is cut to it.
    """

    def __init__(self, seconds: float | timedelta) -> None:
        self.seconds = delay_seconds(seconds, name="Snooze")
        super().__init__(f"snoozed for {self.seconds:g}s")


class Discard(Exception):
    """Fail the job now, without further attempts, recording ``reason`` as its error."""

    def __init__(self, reason: str = "discarded by its task") -> None:
        self.reason = reason
        super().__init__(reason)


class TaskNotFound(LookupError):
    """A job names a task that is not registered in this process (see ``registry``)."""


class MalformedJob(TypeError):
    """A job's stored ``args`` are not a JSON array, its ``kwargs`` or ``metadata`` not a JSON
    object, or one of them cannot be read at all: a row written by something other than
    enqueue, such as an edit by hand."""


class OutcomeNotStored(Exception):
    """The database refused to store how an attempt ended; the job failed with this instead."""


class CompletionRefused(Exception):
    """An atomic job's completion was refused as its transaction was about to commit: the job
    was cancelled, or its lease lost, while its handler ran. What the handler wrote was rolled
    back with it."""


class JobRescued(Exception):
    """The attempt's worker stopped renewing its lease; the rescuer took the job back."""


class ScheduleNotFound(LookupError):
    """No periodic schedule of that name is configured, in ``EDDYQ["PERIODIC"]`` or by
    ``@task(cron=...)``."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"no periodic schedule {name!r} is configured (in EDDYQ['PERIODIC'] or by "
            "@task(cron=...))"
        )


class InvalidWorkflow(ValueError):
    """A workflow that cannot be stored as built: a cycle, a step of another workflow, an
    unknown step, a name used twice. Nothing of it was stored."""
