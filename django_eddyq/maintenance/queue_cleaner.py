"""The queue cleaner: forgets queues nobody has used for a while."""

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
    queue with unfinished (scheduled, available, running or retryable) jobs.
    """

    name = "queue_cleaner"
    interval_setting = "QUEUE_CLEANER_INTERVAL"
    verb = "deleted"

    def run_once(self, now: datetime | None = None) -> int:
        period = bounded_period(eddyq_settings.QUEUE_RETENTION)
        if period is None:
            return 0
        params: dict[str, Any] = {"now": now, "period": period}
        with self.cursor() as cursor:
            cursor.execute(sql.DELETE_STALE_QUEUES, params)
            (deleted,) = cursor.fetchone()
        return int(deleted)
