"""The reindexer: rebuilds the jobs table's churning indexes on a cron schedule.

Every job passes in and out of the partial indexes for claiming, scheduling and leases; pages
emptied by a burst of jobs are never given back, and a rebuild from scratch is the only way to
shrink such an index again. ``REINDEX INDEX CONCURRENTLY`` does that without blocking writes.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, ClassVar

from croniter import croniter
from django.db import connections
from django.db.transaction import TransactionManagementError
from psycopg import sql as psycopg_sql

from django_eddyq import sql
from django_eddyq.conf import eddyq_settings
from django_eddyq.maintenance.service import Service

logger = logging.getLogger(__name__)


class Reindexer(Service):
    """Rebuilds the indexes of REINDEX_INDEXES at the times of REINDEX_SCHEDULE (in UTC).

    One index at a time, to spare the database; each first loses the invalid leftovers of an
    interrupted concurrent rebuild of it, and an index some other session is building on the
    jobs table right now is left alone. Its passes are fenced by the leader lease like every
    service's (see ``run_once`` for the rebuild itself). The loop never rebuilds on start: it
    waits for the schedule's next time by the database's clock, looking again at least every
    ``longest_wait`` seconds so a changed clock or schedule is noticed.
    """

    name = "reindexer"
    interval_setting = "REINDEX_SCHEDULE"
    verb = "rebuilt"
    longest_wait: ClassVar[float] = 3600.0

    def __init__(self) -> None:
        super().__init__()
        self._schedule: str | None = None
        self._due: datetime | None = None

    def interval(self) -> float | None:
        return None if eddyq_settings.REINDEX_SCHEDULE is None else self.longest_wait

    # Scheduling.
    @staticmethod
    def next_time(schedule: str, after: datetime) -> datetime:
        """The first time of ``schedule`` strictly after ``after``, read in UTC."""
        following: datetime = croniter(schedule, after.astimezone(UTC)).get_next(datetime)
        return following.astimezone(UTC)

    @property
    def due(self) -> datetime | None:
        """When the loop rebuilds next; None until its first pass has looked at the clock."""
        return self._due

    def loop_pass(self) -> int:
        """Rebuild if the schedule's time has come, then aim at its next time."""
        schedule = eddyq_settings.REINDEX_SCHEDULE
        now = self.database_now()
        if schedule is None:
            self._schedule = self._due = None
            return 0
        if schedule != self._schedule or self._due is None:
            self._schedule, self._due = schedule, self.next_time(schedule, now)
            return 0
        if now < self._due:
            return 0
        # Aimed at the next time first: a failing rebuild waits for it rather than repeating.
        self._due = self.next_time(schedule, now)
        return self.fenced_pass(self.run_once)

    def next_delay(self, interval: float) -> float:
        if self._due is None:
            return interval
        return max(0.0, min(interval, (self._due - self.database_now()).total_seconds()))

    # Rebuilding.
    def run_once(self, now: datetime | None = None) -> int:
        """Rebuild every index of REINDEX_INDEXES now, whatever the schedule.

        Returns how many indexes it rebuilt plus how many invalid leftovers it dropped. Needs
        the connection in autocommit, outside ``atomic()``: PostgreSQL runs the concurrent
        forms only outside a transaction. ``now`` is accepted like every service's, unused.
        """
        connection = connections[eddyq_settings.DATABASE]
        if connection.in_atomic_block or not connection.get_autocommit():
            raise TransactionManagementError(
                "The reindexer runs REINDEX CONCURRENTLY, which cannot run inside a transaction;"
                " call it in autocommit mode, outside atomic()."
            )
        done = 0
        for name in eddyq_settings.REINDEX_INDEXES:
            if self.stopping:
                break
            statements = self.plan(name)
            if not statements:
                continue
            *drops, rebuild = statements
            for statement in drops:
                self._run(statement)
                done += 1
            # A rebuild may take longer than the lease left when it starts, so it has no
            # statement timeout: a watchdog cancels it once this process stops holding the
            # lease. A process paused mid-rebuild cannot cancel it, and it runs on beside the
            # next leader; that is safe because REINDEX CONCURRENTLY changes no row and holds
            # eddyq_jobs' SHARE UPDATE EXCLUSIVE lock to its end, which every other rebuild and
            # drop of its indexes waits for, and because plan() leaves an index alone while any
            # build on the table is under way.
            with self.lease_watched():
                self._run(rebuild)
            done += 1
        return done

    def _run(self, statement: str) -> None:
        logger.info("eddyq %s: %s", self.name, statement)
        with self.cursor() as cursor:
            cursor.execute(statement)

    def planned(self, now: datetime | None = None) -> list[str]:
        """The statements a pass would run now, in order, without running them: a dry run.

        Reads the catalog only, so it may run inside a transaction.
        """
        return [
            statement for name in eddyq_settings.REINDEX_INDEXES for statement in self.plan(name)
        ]

    def plan(self, name: str) -> list[str]:
        """The statements that rebuild the index ``name``: drops of its invalid leftovers, then
        the rebuild. Nothing for an unknown name (logged as a WARNING), nor while an index
        build on the jobs table is under way (logged as INFO): it could be a rebuild of this
        very index, whose work in progress would look like a leftover."""
        with self.cursor() as cursor:
            cursor.execute(sql.REINDEX_FIND_INDEX, {"name": name})
            found = cursor.fetchone()
            if found is None:
                logger.warning(
                    "eddyq %s: %r in REINDEX_INDEXES is not an index of eddyq_jobs; skipped",
                    self.name,
                    name,
                )
                return []
            cursor.execute(sql.REINDEX_BUILDS_IN_PROGRESS)
            builds = cursor.fetchall()
            if builds:
                logger.info(
                    "eddyq %s: %s skipped: an index build on eddyq_jobs is under way (%s)",
                    self.name,
                    name,
                    ", ".join(
                        f"{command or 'a hidden build'} by pid {pid}" for pid, command in builds
                    ),
                )
                return []
            cursor.execute(sql.REINDEX_LEFTOVERS, {"name": name})
            leftovers = cursor.fetchall()
            raw_connection = cursor.connection
        schema, index = found
        return [
            *(
                self._statement(sql.DROP_LEFTOVER_INDEX, leftover_schema, leftover, raw_connection)
                for leftover_schema, leftover in leftovers
            ),
            self._statement(sql.REINDEX_INDEX, schema, index, raw_connection),
        ]

    @staticmethod
    def _statement(template: str, schema: str, index: str, raw_connection: Any) -> str:
        composed = psycopg_sql.SQL(template).format(index=psycopg_sql.Identifier(schema, index))
        return composed.as_string(raw_connection)
