"""Cancel, retry or delete every job of a filter (``selection.JobFilter``), however many: the
command line's ``retry``, ``cancel`` and ``delete`` and the admin's actions call these.

A walk takes the matching jobs in id order, a bounded batch at a time, each batch in a short
transaction of its own, and changes each batch by the statement that changes a single job
(``operations.cancel_many``, ``retry_many``, ``delete_many``): the same rule, the same
notifications, the same batch completion. No transaction or lock outlives a batch, so a walk
over a million jobs holds up neither the workers nor the tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import OperationalError, connections, transaction
from psycopg import errors

from django_eddyq import sql
from django_eddyq.conf import eddyq_settings
from django_eddyq.models import Job
from django_eddyq.operations import ChangedJob, cancel_many, delete_many, retry_many
from django_eddyq.selection import JobFilter
from django_eddyq.vocabulary import JobState

#: Jobs changed per batch, each batch in a transaction of its own.
BATCH_SIZE = 1000
#: Jobs read per batch of a dry run: it locks and writes nothing, so its batches may be larger.
DRY_RUN_BATCH_SIZE = 10_000
#: A batch aims to take no longer than this: the id range it scans shrinks past it.
BATCH_SECONDS = 0.5
#: The widest id range one batch scans for matching jobs.
MAX_SPAN = 200_000
#: How many times a batch that deadlocked with a worker is tried, in all.
DEADLOCK_ATTEMPTS = 3
#: How many ids a result keeps as a sample of the jobs changed.
SAMPLE_SIZE = 10


@dataclass
class BulkResult:
    """What a bulk operation did, so far: ``after`` is the keyset position (every matching
    job with an id up to it has been walked), ``end`` the highest id it walks to, fixed as it
    began, so that jobs enqueued meanwhile are not in its set."""

    operation: str
    dry_run: bool
    after: int
    end: int
    matched: int = 0
    changed: int = 0
    cancel_requested: int = 0
    sample: list[int] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """Matched, but left alone by the operation's rule (say, retrying a running job)."""
        return self.matched - self.changed

    @property
    def done(self) -> bool:
        return self.after >= self.end

    def as_dict(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "dry_run": self.dry_run,
            "matched": self.matched,
            "changed": self.changed,
            "cancel_requested": self.cancel_requested,
            "skipped": self.skipped,
            "sample": self.sample,
            "done": self.done,
            "after": self.after,
            "end": self.end,
        }


type Progress = Callable[[BulkResult], None]
type OnBatch = Callable[[list[ChangedJob]], None]


def retry_jobs(selection: JobFilter, **options: Any) -> BulkResult:
    """Retry every job of ``selection`` that ``retry_job`` would: failed, cancelled,
    retryable and scheduled jobs become available now; others are counted as skipped."""
    return _walk("retry", retry_many, sql.RETRIABLE_JOBS, selection, **options)


def cancel_jobs(selection: JobFilter, **options: Any) -> BulkResult:
    """Cancel every job of ``selection`` that ``cancel_job`` would: the waiting ones at once,
    the running ones by asking their workers; ended jobs are counted as skipped."""
    return _walk("cancel", cancel_many, sql.CANCELLABLE_JOBS, selection, **options)


def delete_jobs(selection: JobFilter, **options: Any) -> BulkResult:
    """Delete every job of ``selection`` that has ended; the others are counted as skipped."""
    return _walk("delete", delete_many, sql.DELETABLE_JOBS, selection, **options)


#: Each operation, by name, and which jobs it changes, in words, for the confirmations.
OPERATIONS: dict[str, Callable[..., BulkResult]] = {
    "retry": retry_jobs,
    "cancel": cancel_jobs,
    "delete": delete_jobs,
}
RULES = {
    "retry": "failed, cancelled, retryable and scheduled jobs become available now",
    "cancel": "waiting jobs are cancelled, running ones asked to stop; ended jobs are left alone",
    "delete": "completed, failed and cancelled jobs are deleted; unfinished ones are left alone",
}


def _walk(
    operation: str,
    change: Callable[[Any, Sequence[int]], list[ChangedJob]],
    would_change: str,
    selection: JobFilter,
    *,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    progress: Progress | None = None,
    on_batch: OnBatch | None = None,
    seconds: float | None = None,
    after: int = 0,
    end: int | None = None,
) -> BulkResult:
    """Walk the jobs of ``selection`` in id order, ``batch_size`` at most at a time (a dry run:
    ``DRY_RUN_BATCH_SIZE`` at least), each batch in its own short transaction: its jobs are
    selected and locked in id order, then changed by the operation's one statement, which
    applies the same rule as for a single job; a batch that deadlocked is done again.

    A batch scans an id range, not the whole table: widened while the jobs it finds are few
    and quick to read, narrowed when a batch takes longer than ``BATCH_SECONDS``; so no batch
    reads far, however sparse the matches. ``on_batch`` gets each batch's changed jobs inside
    its transaction; ``progress`` the running result after each batch. With ``seconds``, no
    batch starts after that long (one always runs): the result's ``after`` and ``end`` resume
    the walk.
    """
    if not 1 <= batch_size <= 100_000:
        raise ValueError("batch_size: give 1 to 100,000 jobs")
    if dry_run:
        batch_size = max(batch_size, DRY_RUN_BATCH_SIZE)
    alias = eddyq_settings.DATABASE
    jobs = selection.apply(Job.objects.using(alias)).order_by("pk")
    if end is None:
        with connections[alias].cursor() as cursor:
            cursor.execute(sql.JOB_ID_RANGE)
            first, last = cursor.fetchone()
        after, end = max(after, (first or 1) - 1), last or 0
    if selection.ids:
        after, end = max(after, min(selection.ids) - 1), min(end, max(selection.ids))
    result = BulkResult(operation=operation, dry_run=dry_run, after=after, end=end)
    span = batch_size * 10
    started = time.monotonic()
    while not result.done:
        upto = min(result.after + span, result.end)
        batch_started = time.monotonic()
        window = jobs.filter(pk__gt=result.after, pk__lte=upto)
        for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
            try:
                with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                    if dry_run:
                        ids = list(window.values_list("pk", flat=True)[:batch_size])
                        cursor.execute(would_change, {"ids": ids})
                        changed = [ChangedJob(*row[:3]) for row in cursor.fetchall()]
                    else:
                        # Locked as selected, in id order: the filter still holds as they
                        # change.
                        locked = window.select_for_update().values_list("pk", flat=True)
                        ids = list(locked[:batch_size])
                        changed = change(cursor, ids) if ids else []
                        if on_batch is not None and changed:
                            on_batch(changed)
                break
            except OperationalError as error:
                # A worker finishing a job of the batch as it is locked can deadlock with it
                # (its finish locks in its own order); PostgreSQL rolls one side back, and
                # when it is this one, the batch is done again.
                deadlock = isinstance(error.__cause__, errors.DeadlockDetected)
                if not deadlock or attempt == DEADLOCK_ATTEMPTS:
                    raise
        result.matched += len(ids)
        result.changed += len(changed)
        if operation == "cancel":
            result.cancel_requested += sum(job.state == JobState.RUNNING for job in changed)
        room = SAMPLE_SIZE - len(result.sample)
        result.sample += sorted(job.id for job in changed)[:room]
        full = len(ids) == batch_size
        result.after = ids[-1] if full else upto
        took = time.monotonic() - batch_started
        if took > BATCH_SECONDS:
            span = max(span // 2, batch_size)
        elif not full:
            span = min(span * 2, MAX_SPAN)
        if progress is not None:
            progress(result)
        if seconds is not None and time.monotonic() - started >= seconds:
            break
    return result
