"""Jobs finished over time, and the queues' depth: the series the admin's charts draw and the
recent counts ``eddyq status`` shows.

Read from the activity counters (``eddyq_activity``: the workers add their outcomes to them,
the activity sampler adds each queue's depth and folds past hours), never from the jobs: a
read covers at most a few thousand rows, however many jobs the table holds. Buckets are by the
database's clock, in UTC.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections

from django_eddyq import sql
from django_eddyq.conf import eddyq_settings

#: The buckets a series may have, and the date_trunc unit of each.
BUCKETS = {timedelta(minutes=1): "minute", timedelta(hours=1): "hour"}
#: A series has at most this many buckets.
MAX_BUCKETS = 1_000
#: The windows of ``recent_counts``, in minutes.
RECENT_MINUTES = (1, 5, 15)
#: The counts a bucket has, in the order of the series' statement.
COUNTS = ("completed", "failed", "retried", "cancelled", "snoozed")


@dataclass(frozen=True)
class Bucket:
    """What happened in one bucket: jobs that completed, failed, became retryable (retried),
    were cancelled or snoozed; and the queues' depth, the sum of each queue's highest sample of
    its available jobs in the bucket (None: not sampled, as when the sampler does not run)."""

    start: datetime
    completed: int
    failed: int
    retried: int
    cancelled: int
    snoozed: int
    available: int | None


@dataclass(frozen=True)
class Series:
    window: timedelta
    bucket: timedelta
    queue: str | None  # None: every queue
    buckets: list[Bucket]

    @property
    def totals(self) -> dict[str, int]:
        return {name: sum(getattr(bucket, name) for bucket in self.buckets) for name in COUNTS}


@dataclass(frozen=True)
class RecentCounts:
    """A queue's jobs completed and failed within the last 1, 5 and 15 minutes (keys of
    ``RECENT_MINUTES``): the current minute so far and that many whole minutes before it."""

    completed: dict[int, int]
    failed: dict[int, int]


def activity(
    window: timedelta = timedelta(hours=1),
    bucket: timedelta = timedelta(minutes=1),
    *,
    queue: str | None = None,
    now: datetime | None = None,
    using: str | None = None,
) -> Series:
    """The activity of the last ``window``, in buckets of ``bucket`` (a minute or an hour),
    oldest first, the last one the current bucket so far; every bucket is there, with zeros
    where nothing was counted. Of one ``queue``, or of all; ``now`` defaults to the database's
    clock."""
    unit = BUCKETS.get(bucket)
    if unit is None:
        raise ValueError(f"bucket must be a minute or an hour, not {bucket!r}")
    count = -(-window // bucket)
    if not 1 <= count <= MAX_BUCKETS:
        raise ValueError(f"a window of {window} has {count} buckets, not 1 to {MAX_BUCKETS}")
    params: dict[str, Any] = {
        "unit": unit,
        "step": bucket,
        "buckets": count,
        "queue": queue,
        "now": now,
    }
    with connections[using or eddyq_settings.DATABASE].cursor() as cursor:
        cursor.execute(sql.ACTIVITY_SERIES, params)
        rows = cursor.fetchall()
    return Series(
        window=window,
        bucket=bucket,
        queue=queue,
        buckets=[
            Bucket(
                start,
                completed=int(completed),
                failed=int(failed),
                retried=int(retried),
                cancelled=int(cancelled),
                snoozed=int(snoozed),
                available=None if depth is None else int(depth),
            )
            for start, completed, failed, retried, cancelled, snoozed, depth in rows
        ],
    )


def recent_counts(
    *, now: datetime | None = None, using: str | None = None
) -> dict[str, RecentCounts]:
    """Per queue with any in the last 15 minutes, the jobs completed and failed within each of
    ``RECENT_MINUTES``."""
    with connections[using or eddyq_settings.DATABASE].cursor() as cursor:
        cursor.execute(sql.RECENT_ACTIVITY, {"now": now})
        rows = cursor.fetchall()
    return {
        str(queue): RecentCounts(
            completed=dict(zip(RECENT_MINUTES, map(int, counts[:3]), strict=True)),
            failed=dict(zip(RECENT_MINUTES, map(int, counts[3:]), strict=True)),
        )
        for queue, *counts in rows
    }
