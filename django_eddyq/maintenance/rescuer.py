"""The rescuer: running jobs whose lease has passed go back to retryable, or fail."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import DatabaseError
from psycopg.types.json import Jsonb

from django_eddyq import registry, sql
from django_eddyq.exceptions import JobRescued, TaskNotFound
from django_eddyq.handlers import Handler, retry_delay
from django_eddyq.lifecycle import DATABASE_UNREACHABLE
from django_eddyq.maintenance.service import Service
from django_eddyq.operations import complete_batches
from django_eddyq.steps import settle_ended
from django_eddyq.vocabulary import JobState

logger = logging.getLogger(__name__)

# Rows locked and updated per statement, so that a rescue never holds many locks for long.
RESCUE_BATCH = 500

type StuckJob = tuple[int, str, int, int, str | None, str, bool]
type Rescue = tuple[str, float | None, dict[str, Any]]


class Rescuer(Service):
    """Rescues jobs whose worker stopped renewing their lease (crashed, killed, partitioned).

    The lease decides, not the job's age: a job whose worker keeps heartbeating is never
    rescued however long it runs. A rescued job is retryable after its task's backoff, or
    failed if it has used its attempts; either way with an error entry naming the worker that
    lost it. A late finish from that worker is then fenced out. A row that cannot be rescued
    (the database refuses the rescue) is set aside, failed with an error entry saying why,
    and the others are rescued all the same.
    """

    name = "rescuer"
    interval_setting = "RESCUE_INTERVAL"
    verb = "rescued"

    def run_once(self, now: datetime | None = None) -> int:
        rescued = 0
        while True:
            with self.atomic(), self.cursor() as cursor:
                cursor.execute(sql.SELECT_STUCK_JOBS, {"now": now, "limit": RESCUE_BATCH})
                stuck: list[StuckJob] = cursor.fetchall()
            if not stuck:
                break
            try:
                rescued += self._rescue(stuck, now)
            except DATABASE_UNREACHABLE:
                raise
            except DatabaseError:
                # One of them is refused: each on its own, so that only that one is set aside.
                for job in stuck:
                    rescued += self._rescue_alone(job, now)
            if len(stuck) < RESCUE_BATCH:
                break
        return rescued

    def _rescue(self, stuck: list[StuckJob], now: datetime | None) -> int:
        """Rescue ``stuck`` in one transaction (those still stuck once it has locked them)."""
        plan = [_rescue_plan(*job) for job in stuck]
        with self.atomic(), self.cursor() as cursor:
            cursor.execute(
                sql.RESCUE_JOBS,
                {
                    "now": now,
                    "ids": [job[0] for job in stuck],
                    "states": [state for state, _delay, _error in plan],
                    "delays": [delay for _state, delay, _error in plan],
                    "errors": [Jsonb(error) for _state, _delay, error in plan],
                },
            )
            rows = cursor.fetchall()
            ended_batches = {batch for _id, state, batch in rows if batch and state != "retryable"}
            if ended_batches:
                complete_batches(cursor, sorted(ended_batches))
            settle_ended(cursor, [job_id for job_id, state, _ in rows if state != "retryable"])
        by_id = {job[0]: job for job in stuck}
        for job_id, state, _batch in rows:
            if state == JobState.FAILED:
                _log_last_failure(by_id[job_id])
        return len(rows)

    def _rescue_alone(self, job: StuckJob, now: datetime | None) -> int:
        try:
            return self._rescue([job], now)
        except DATABASE_UNREACHABLE:
            raise
        except DatabaseError as error:
            refused = error
        job_id, task = job[0], job[1]
        logger.error(
            "eddyq rescuer: job %s (%s) cannot be rescued (%s); set aside as failed",
            job_id,
            task,
            refused,
        )
        _state, _delay, entry = _rescue_plan(*job)
        entry["error"] += f"; it could not be rescued, and was set aside: {refused}"
        params: dict[str, Any] = {"id": job_id, "error": Jsonb(entry), "now": now}
        try:
            with self.atomic(), self.cursor() as cursor:
                cursor.execute(sql.SET_ASIDE_STUCK_JOB, params)
                batches = [batch for (batch,) in cursor.fetchall() if batch]
                if batches:
                    complete_batches(cursor, batches)
                settle_ended(cursor, [job_id])
        except DATABASE_UNREACHABLE:
            raise
        except DatabaseError:
            logger.exception(
                "eddyq rescuer: job %s (%s) cannot even be set aside; left as it is", job_id, task
            )
            return 0
        return 1


def _log_last_failure(job: StuckJob) -> None:
    """A job the rescue failed for good: its last attempt's worker died with it."""
    job_id, task, attempt, max_attempts, locked_by, locked_until, _cancel = job
    logger.error(
        "eddyq job %s (%s) failed for good after attempt %d of %d: worker %s stopped renewing "
        "its lease (it expired at %s)",
        job_id,
        task,
        attempt,
        max_attempts,
        locked_by,
        locked_until,
        extra={
            "eddyq_job_id": job_id,
            "eddyq_task": task,
            "eddyq_attempt": attempt,
            "eddyq_max_attempts": max_attempts,
            "eddyq_worker_id": locked_by,
        },
    )


def _rescue_plan(
    job_id: int,
    task: str,
    attempt: int,
    max_attempts: int,
    locked_by: str | None,
    locked_until: str,
    cancel_requested: bool,
) -> Rescue:
    error = JobRescued(
        f"worker {locked_by} stopped renewing the lease of attempt {attempt} "
        f"(it expired at {locked_until})"
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
        handler = registry.handler(task)
    except TaskNotFound:
        handler = None
    return "retryable", retry_delay(handler, attempt), entry
