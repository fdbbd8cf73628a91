"""The scheduler: scheduled and retryable jobs whose time has come become available."""

from __future__ import annotations

from datetime import datetime

from django_eddyq import sql
from django_eddyq.maintenance.service import Service

# Rows promoted per statement (by the scheduler, and by a burst worker for itself).
PROMOTE_BATCH = 1000
# Wake this much after a job's run_at, so that the database sees it as due.
DUE_MARGIN_SECONDS = 0.002


class Scheduler(Service):
    """Promotes due jobs and notifies their queues, so that idle workers claim them at once.

    Beyond a fixed tick: after each pass it sleeps until the next job comes due (capped by
    ``SCHEDULER_INTERVAL``), and a newly scheduled job wakes it through NOTIFY, so a job
    scheduled a second ahead starts within milliseconds of its time, not up to a tick late.
    """

    name = "scheduler"
    interval_setting = "SCHEDULER_INTERVAL"
    verb = "made available"
    wake_on = sql.SCHEDULED_CHANNEL

    def run_once(self, now: datetime | None = None) -> int:
        promoted = 0
        while True:
            with self.cursor() as cursor:
                cursor.execute(sql.PROMOTE_DUE_ANY_QUEUE, {"now": now, "limit": PROMOTE_BATCH})
                count = int(cursor.fetchone()[0])
            promoted += count
            if count < PROMOTE_BATCH:
                return promoted

    def next_delay(self, interval: float) -> float:
        with self.cursor() as cursor:
            cursor.execute(sql.NEXT_DUE_IN, {"now": None})
            due_in = cursor.fetchone()[0]
        if due_in is None:
            return interval
        return min(interval, max(float(due_in), 0.0) + DUE_MARGIN_SECONDS)
