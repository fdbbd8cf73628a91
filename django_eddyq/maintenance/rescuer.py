"""The rescuer: running jobs whose lease has passed go back to retryable, or fail."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from django_eddyq import sql
from django_eddyq.batches import complete_batches
from django_eddyq.exceptions import JobRescued, TaskNotFound
from django_eddyq.handlers import Handler, resolve, retry_delay
from django_eddyq.maintenance.service import Service

logger = logging.getLogger("django_eddyq")

# Rows locked and updated per statement, so that a rescue never holds many locks for long.
RESCUE_BATCH = 500


class Rescuer(Service):
    """Rescues jobs whose worker stopped renewing their lease (crashed, killed, partitioned).

    The lease decides, not the job's age: a job whose worker keeps heartbeating is never
    rescued however long it runs. A rescued job is retryable after its task's backoff, or
    failed if it has used its attempts; either way with an error entry naming the worker that
    lost it. A late finish from that worker is then fenced out.
    """

    name = "rescuer"
    interval_setting = "RESCUE_INTERVAL"
    verb = "rescued"

    def run_once(self, now: datetime | None = None) -> int:
        rescued = 0
        while True:
            with self.atomic(), self.cursor() as cursor:
                cursor.execute(sql.SELECT_STUCK_JOBS, {"now": now, "limit": RESCUE_BATCH})
                stuck = cursor.fetchall()
                if not stuck:
                    break
                plan = [_rescue_plan(*row) for row in stuck]
                cursor.execute(
                    sql.RESCUE_JOBS,
                    {
                        "now": now,
                        "ids": [row[0] for row in stuck],
                        "states": [state for state, _delay, _error in plan],
                        "delays": [delay for _state, delay, _error in plan],
                        "errors": [Jsonb(error) for _state, _delay, error in plan],
                    },
                )
                rows = cursor.fetchall()
                rescued += len(rows)
                ended_batches = {
                    batch for _id, state, batch in rows if batch and state != "retryable"
                }
                if ended_batches:
                    complete_batches(cursor, sorted(ended_batches))
            if len(stuck) < RESCUE_BATCH:
                break
        return rescued


def _rescue_plan(
    job_id: int,
    task: str,
    attempt: int,
    max_attempts: int,
    locked_by: str | None,
    locked_until: datetime,
    cancel_requested: bool,
) -> tuple[str, float | None, dict[str, Any]]:
    error = JobRescued(
        f"worker {locked_by} stopped renewing the lease of attempt {attempt} "
        f"(it expired at {locked_until.isoformat()})"
    )
    entry = {
        "attempt": attempt,
        "error": f"JobRescued: {error}",
        "exception_class": f"{JobRescued.__module__}.{JobRescued.__qualname__}",
        "traceback": "",
        "rescued_from": locked_by,
    }
    if cancel_requested:
        return "cancelled", None, entry
    if attempt >= max_attempts:
        return "failed", None, entry
    handler: Handler | None
    try:
        handler = resolve(task)
    except TaskNotFound:
        handler = None
    return "retryable", retry_delay(handler, attempt), entry
