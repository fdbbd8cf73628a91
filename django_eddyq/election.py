"""Leader election: one row per election in ``eddyq_leader``, a lease judged by the database clock.

Every worker that runs maintenance campaigns; the one holding the lease runs the maintenance
services, the others wait. The holder renews every ``LEADER_RENEW_INTERVAL``; if it dies, its
lease (``LEADER_LEASE``) runs out and a follower takes over. A leader that stops gracefully
resigns and notifies, so that a follower takes over at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from django_eddyq import db, sql
from django_eddyq.conf import eddyq_settings
from django_eddyq.lifecycle import Loop
from django_eddyq.maintenance.service import Service
from django_eddyq.signals import leader_elected, leader_resigned, send

logger = logging.getLogger(__name__)

ELECTION = "default"
# How often a leader stepping down says that a service is still ending its pass.
SERVICE_STOP_SECONDS = 10.0


class Elector(Loop):
    """Campaigns for, renews and gives up the lease; starts and stops the services with it.

    Safety: the lease it holds is known locally as ``valid_until`` on the monotonic clock,
    measured from when a successful renewal was *sent*, so it never outlives the database's
    own expiry. If renewals keep failing, the elector steps down (stops its services) once less
    than one renew interval of the lease is left, before the lease can have expired, so that
    two leaders never run maintenance at once, even with a slow database.
    """

    name = "elector"

    def __init__(self, worker_id: str, services: Sequence[Service], election: str = ELECTION):
        super().__init__()
        self.worker_id = worker_id
        self.services = list(services)
        self.election = election
        self._connection: psycopg.Connection[tuple[Any, ...]] | None = None
        self._valid_until = 0.0  # monotonic; 0 = not leader
        self._leading = False
        for service in self.services:
            service.lease_left = self.lease_left
            service.leader_id = worker_id

    @property
    def is_leader(self) -> bool:
        return self._leading

    def lease_left(self) -> float:
        """Seconds before this process must stop running maintenance; 0 when it does not lead."""
        if not self._leading:
            return 0.0
        return max(self._step_down_at() - time.monotonic(), 0.0)

    def interval(self) -> float:
        return eddyq_settings.LEADER_RENEW_INTERVAL.total_seconds()

    def next_delay(self, interval: float) -> float:
        if not self._leading:
            return interval
        # Wake in time to step down if this renewal turns out to be the last.
        return max(min(interval, self._step_down_at() - time.monotonic()), 0.0)

    def run_once(self, now: datetime | None = None) -> int:
        """Campaign (or renew); returns 1 if leadership changed hands in this pass.

        A renewal that raises leaves the step-down to ``on_failure``, which steps down only
        once the lease is nearly over.
        """
        sent_at = time.monotonic()
        won = self._campaign()
        if won:
            self._valid_until = sent_at + eddyq_settings.LEADER_LEASE.total_seconds()
            if not self._leading:
                self._take_over()
                return 1
        elif self._leading:
            self._step_down("another process holds the lease")
            return 1
        return 0

    def on_failure(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._leading and time.monotonic() >= self._step_down_at():
            self._step_down("its lease could not be renewed in time")

    def on_stop(self) -> None:
        was_leading = self._leading
        if was_leading:
            self._end_leadership()
        try:
            if was_leading:
                self._connect().execute(sql.RESIGN_LEADER, self._params())
                logger.info("eddyq elector %s: resigned the leadership", self.worker_id)
        except psycopg.Error as error:
            logger.warning("eddyq elector %s: could not resign: %s", self.worker_id, error)
        finally:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
        if was_leading:
            send(leader_resigned, type(self), worker_id=self.worker_id, reason="it stopped")

    def on_leader_notification(self, _payload: str) -> None:
        """A leader resigned: campaign now rather than at the next interval."""
        if not self._leading:
            self.wake()

    def _campaign(self) -> bool:
        connection = self._connect()
        # A renewal that takes longer than an interval is as good as failed. Local: the timeout
        # ends with the transaction, even on a pooled connection.
        timeout_ms = max(int(eddyq_settings.LEADER_RENEW_INTERVAL.total_seconds() * 1000), 100)
        with connection.transaction():
            connection.execute(sql.SET_LOCAL_STATEMENT_TIMEOUT, {"timeout": str(timeout_ms)})
            connection.execute(sql.ENSURE_LEADER_ROW, {"name": self.election})
            won = connection.execute(sql.CAMPAIGN_FOR_LEADER, self._params()).fetchall()
        return bool(won)

    def _take_over(self) -> None:
        self._leading = True
        logger.info("eddyq elector %s: elected leader, starting maintenance", self.worker_id)
        for service in self.services:
            service.start()
        send(leader_elected, type(self), worker_id=self.worker_id)

    def _step_down(self, reason: str) -> None:
        logger.warning("eddyq elector %s: stepping down, %s", self.worker_id, reason)
        self._end_leadership()
        send(leader_resigned, type(self), worker_id=self.worker_id, reason=reason)

    def _end_leadership(self) -> None:
        """Stop the services, withdraw the lease from them, and wait for each to end its pass,
        however long: resigning (or campaigning again) before they end could let a statement
        run beside the next leader. No wait is long: the lease is no longer this process's, so
        the fence refuses their next statement and ends the one under way (see
        ``Service._fence``). They are told to stop first, so that a pass the lease's end cuts
        short knows it was stopped, not starved of its lease."""
        for service in self.services:
            service.stop()
        self._leading = False
        self._valid_until = 0.0
        for service in self.services:
            while not service.join(SERVICE_STOP_SECONDS):
                logger.warning(
                    "eddyq %s: still finishing its pass after stepping down", service.name
                )

    def _step_down_at(self) -> float:
        return self._valid_until - eddyq_settings.LEADER_RENEW_INTERVAL.total_seconds()

    def _params(self) -> dict[str, Any]:
        return {
            "name": self.election,
            "leader_id": self.worker_id,
            "lease_seconds": eddyq_settings.LEADER_LEASE.total_seconds(),
        }

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._connection is None or self._connection.closed:
            self._connection = db.connect()
        return self._connection
