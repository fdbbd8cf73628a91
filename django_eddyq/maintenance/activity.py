"""The activity sampler: each queue's depth once a minute, the hours past folded, the old rows
deleted.

The counts of finished jobs are written by the workers themselves (``sql.FINISH_JOBS``) and by
the rescuer (``sql.RESCUE_JOBS``), a row per worker, queue and minute; this service keeps the
table small: a day of a busy fleet's minutes becomes 24 rows per queue once folded.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from django_eddyq import sql
from django_eddyq.conf import eddyq_settings
from django_eddyq.maintenance.service import Service
from django_eddyq.retention import bounded_period

#: A queue's available jobs are counted up to here; past it, its depth is an estimate.
COUNT_LIMIT = 10_000
#: Queues sampled, at most, the first by name.
QUEUE_LIMIT = 1_000


class ActivitySampler(Service):
    """Each pass, in this order: deletes rows older than ACTIVITY_RETENTION, a batch of
    ``batch_size`` a statement; folds each hour that ended before the last hour began into one
    row per queue, an hour a statement; writes each queue's available jobs as the sample of the
    minute (a second pass in the same minute overwrites it).

    Returns the rows deleted and folded; the samples are left out, so that a pass that only
    sampled logs nothing.
    """

    name = "activity_sampler"
    interval_setting = "ACTIVITY_SAMPLE_INTERVAL"
    verb = "deleted or folded"
    batch_size: ClassVar[int] = 10_000

    def run_once(self, now: datetime | None = None) -> int:
        changed = 0
        with self.cursor() as cursor:
            period = bounded_period(eddyq_settings.ACTIVITY_RETENTION)
            while period is not None and not self.stopping:
                params: dict[str, Any] = {"now": now, "period": period, "limit": self.batch_size}
                cursor.execute(sql.DELETE_OLD_ACTIVITY, params)
                deleted = int(cursor.fetchone()[0])
                changed += deleted
                if deleted < self.batch_size:
                    break
            while not self.stopping:
                cursor.execute(sql.FOLD_ACTIVITY_HOUR, {"now": now})
                folded = int(cursor.fetchone()[0])
                if not folded:
                    break
                changed += folded
            cursor.execute(
                sql.SAMPLE_QUEUE_DEPTH,
                {"now": now, "limit": COUNT_LIMIT, "queue_limit": QUEUE_LIMIT},
            )
        return changed
