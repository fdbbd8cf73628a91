"""The queue cleaner: forgets queues nobody has used for a while, workers long gone, and rate
buckets full again."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django_eddyq import sql
from django_eddyq.conf import eddyq_settings
from django_eddyq.maintenance.service import Service
from django_eddyq.retention import bounded_period


class QueueCleaner(Service):
    """Deletes ``eddyq_queues`` rows not updated within QUEUE_RETENTION, so the table doesn't
    keep every queue name ever used.

    A paused queue stays whatever its age: deleting its row would silently resume it. So does a
    queue with unfinished (scheduled, available, running or retryable) jobs. The registry of
    workers is kept the same way: a worker unseen for WORKER_RETENTION (stopped, or lost) goes.
    A rate limit's bucket goes once it is full again, which its missing row also means.
    """

    name = "queue_cleaner"
    interval_setting = "QUEUE_CLEANER_INTERVAL"
    verb = "deleted"

    def run_once(self, now: datetime | None = None) -> int:
        deleted = 0
        with self.cursor() as cursor:
            queue_period = bounded_period(eddyq_settings.QUEUE_RETENTION)
            if queue_period is not None:
                params: dict[str, Any] = {"now": now, "period": queue_period}
                cursor.execute(sql.DELETE_STALE_QUEUES, params)
                deleted += int(cursor.fetchone()[0])
            worker_period = bounded_period(eddyq_settings.WORKER_RETENTION)
            if worker_period is not None:
                params = {"now": now, "period": worker_period}
                cursor.execute(sql.DELETE_FORGOTTEN_WORKERS, params)
                deleted += cursor.rowcount
            cursor.execute(sql.DELETE_FULL_RATE_BUCKETS, {"now": now})
            deleted += int(cursor.rowcount)
        return deleted
