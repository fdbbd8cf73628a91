"""The cleaner: deletes finished jobs and batches once their retention has passed.

Which jobs have expired is decided by ``retention.job_expiries``, shared with ``Job.objects``,
which hides exactly the jobs the cleaner would delete.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

from django_eddyq import sql
from django_eddyq.conf import eddyq_settings
from django_eddyq.maintenance.service import Service
from django_eddyq.retention import bounded_period, job_expiries

logger = logging.getLogger(__name__)


class Cleaner(Service):
    """Deletes completed, failed and cancelled jobs past their retention, and complete batches.

    A job's deadline is ``finalized_at`` plus its retention: the job's own for its state when
    ``Job.retention`` names the state, else ``RETENTION[state]`` as it is at the time of the
    pass, so a changed setting applies to jobs finalized before. None keeps forever; zero
    deletes at the next pass. Rows go in batches of ``batch_size``, each its own short
    statement, so the cleaner never holds many locks for long and skips rows others hold.
    Jobs of a deleted batch stay, their ``batch`` set to NULL by the database. A workflow goes
    once it has ended plus its retention, its jobs with it (they expire with it: see
    ``sql.WORKFLOW_PROGRESS``).
    """

    name = "cleaner"
    interval_setting = "CLEANER_INTERVAL"
    verb = "deleted"
    batch_size: ClassVar[int] = 1000
    # A workflow takes its steps with it: fewer per statement.
    workflow_batch_size: ClassVar[int] = 50

    def run_once(self, now: datetime | None = None) -> int:
        retention = eddyq_settings.RETENTION
        deleted = 0
        for expiry in job_expiries(retention, now=sql.NOW_POSITIONAL, now_params=(now,)):
            count = self.delete_expired("eddyq_jobs", expiry.sql, expiry.params)
            if count:
                kind = "own retention" if expiry.override else "RETENTION"
                logger.debug("eddyq cleaner: %d %s jobs by their %s", count, expiry.state, kind)
            deleted += count
        batch_period = bounded_period(retention["batch"])
        if batch_period is not None:
            deleted += self.delete_expired("eddyq_batches", sql.BATCH_EXPIRED, (now, batch_period))
        deleted += self.delete_expired_workflows(now)
        return deleted

    def delete_expired_workflows(self, now: datetime | None) -> int:
        """Delete the workflows past their retention (counted once each), with their steps,
        their dependencies and what is left of their jobs, a batch per statement."""
        deleted = 0
        with self.cursor() as cursor:
            while not self.stopping:
                cursor.execute(
                    sql.DELETE_EXPIRED_WORKFLOWS, {"now": now, "limit": self.workflow_batch_size}
                )
                (count,) = cursor.fetchone()
                deleted += count
                if count < self.workflow_batch_size:
                    break
        return deleted

    def delete_expired(self, table: str, condition: str, params: Sequence[Any]) -> int:
        """Delete the rows of ``table`` matching ``condition``, a batch per statement, until a
        batch comes back short; returns how many went."""
        deleted = 0
        resume_from: datetime | None = None
        with self.cursor() as cursor:
            raw = cursor.connection
            first = sql.delete_expired_statement(table, condition, resume=False).as_string(raw)
            resumed = sql.delete_expired_statement(table, condition, resume=True).as_string(raw)
            while not self.stopping:
                if resume_from is None:
                    cursor.execute(first, [*params, self.batch_size])
                else:
                    cursor.execute(resumed, [*params, resume_from, self.batch_size])
                count, resume_from = cursor.fetchone()
                deleted += count
                if count < self.batch_size:
                    break
        return deleted
