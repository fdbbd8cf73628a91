"""What every maintenance service shares: its interval setting, its connection, its guard."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar

from django.db import DatabaseError, connections, transaction
from django.db.backends.utils import CursorWrapper

from django_eddyq import sql
from django_eddyq.conf import eddyq_settings
from django_eddyq.db import database_now
from django_eddyq.lifecycle import Loop

logger = logging.getLogger(__name__)

# How often a watchdog (``Service.lease_watched``) looks at the lease.
WATCHDOG_SECONDS = 0.1


class LeaseExpired(Exception):
    """A maintenance pass was about to run a statement after its leader lease ran out."""


class Service(Loop):
    """A maintenance service: ``run_once(now=None)`` does a single pass and returns the rows
    it changed; as a loop (on the leader) it repeats that every ``interval_setting``.

    SQL takes ``now`` as a parameter that defaults to the database clock, so that tests drive
    single passes with an injected ``now`` instead of sleeping. Passes run on Django's
    connection to the queue database for the service's thread.
    """

    #: The settings key of the interval; its value None (or 0) disables the service.
    interval_setting: ClassVar[str]
    #: What the counted rows are, for logs and ``eddyq_maintenance``: "rescued", "deleted", ...
    verb: ClassVar[str] = "changed"
    #: A NOTIFY channel that should cut the service's wait short.
    wake_on: ClassVar[str | None] = None

    def __init__(self) -> None:
        super().__init__()
        # Set by the elector: seconds left before this process must stop running maintenance
        # (0 when it does not lead). Without an elector (tests, eddyq_maintenance) it is endless.
        self.lease_left: Callable[[], float] = lambda: math.inf
        # The worker id of the elector that runs it, for the logs.
        self.leader_id = ""
        # Set while lease_watched() guards the statements instead of the statement timeout.
        self._watched = threading.Event()

    def interval(self) -> float | None:
        value = getattr(eddyq_settings, self.interval_setting)
        return None if value is None else float(value.total_seconds())

    def run_once(self, now: datetime | None = None) -> int:
        raise NotImplementedError

    def may_run(self) -> bool:
        return self.lease_left() > 0

    def loop_pass(self) -> int:
        """A pass as the loop runs it: ``fenced_pass(self.run_once)``."""
        return self.fenced_pass(self.run_once)

    def fenced_pass(self, run: Callable[[], int]) -> int:
        """Run ``run()`` as a pass: skipped unless this process may run maintenance, each of its
        statements fenced by the lease (see ``_fence``); a pass the fence cuts short is a
        WARNING, unless the service was stopped (its leader resigned or stepped down). A pass
        that ends under the lease logs its leader and its time window, at DEBUG: what an audit
        of "never two leaders" reads."""
        if not self.may_run():
            return 0
        started = time.time()
        try:
            with connections[eddyq_settings.DATABASE].execute_wrapper(self._fence):
                count = run()
        except (LeaseExpired, DatabaseError) as error:
            if self.may_run():
                raise
            if self.stopping:
                # Its leader resigned, or stepped down and says why itself.
                logger.info("eddyq %s: pass cut short, the leader stopped", self.name)
            else:
                logger.warning(
                    "eddyq %s: pass cut short, the leader lease ran out (%s)",
                    self.name,
                    str(error).strip().splitlines()[0]
                    if str(error).strip()
                    else type(error).__name__,
                )
            self.on_failure()
            return 0
        if count:
            logger.info("eddyq %s: %d %s", self.name, count, self.verb)
        if not self.may_run():
            # Paused past its lease after its last statement (or stopped): what it did was
            # under the lease, but its window would claim time the next leader may have had.
            if not self.stopping:
                logger.warning("eddyq %s: pass ended after the leader lease ran out", self.name)
            return count
        logger.debug(
            "eddyq %s: pass by leader %s from %.6f to %.6f",
            self.name,
            self.leader_id,
            started,
            time.time(),
        )
        return count

    def _fence(
        self, execute: Callable[..., Any], statement: str, params: Any, many: bool, context: Any
    ) -> Any:
        """Send ``statement`` only under the lease, with server-side timeouts that end with it.

        Checking the lease before each statement is not enough: a process paused (or starved)
        while its statement waits on a lock would go on, once resumed, beside the next leader.
        The server cancels such a statement, and ends a session idle in a transaction, when
        this process's hold on the lease ends, which is a renew interval before the lease can
        expire in the database. A statement run under ``lease_watched()`` has no statement
        timeout: its watchdog cancels it instead. The timeouts never outlive the statement:
        local to the transaction inside one, put back after it in autocommit.
        """
        left = self.lease_left()
        if left <= 0:
            raise LeaseExpired("the leader lease ran out before the statement was sent")
        if not math.isfinite(left):
            return execute(statement, params, many, context)
        # Rounded up: a statement the server cancels must find the lease over here too, or its
        # error would pass for a failure rather than for the fence.
        statement_ms = "0" if self._watched.is_set() else str(math.ceil(left * 1000))
        # Between the statements of a pass, Python takes milliseconds, not a renew interval.
        idle_ms = str(
            math.ceil(min(left, eddyq_settings.LEADER_RENEW_INTERVAL.total_seconds()) * 1000)
        )
        django_connection = context["connection"]
        local = not django_connection.get_autocommit()
        raw = django_connection.connection
        with raw.cursor() as cursor:
            cursor.execute(
                sql.FENCE_TIMEOUTS,
                {"statement_timeout": statement_ms, "idle_timeout": idle_ms, "local": local},
            )
            prior_statement_ms, prior_idle_ms, *_ = cursor.fetchone()
        if local:
            return execute(statement, params, many, context)
        try:
            return execute(statement, params, many, context)
        finally:
            with raw.cursor() as cursor:
                cursor.execute(
                    sql.RESTORE_TIMEOUTS,
                    {"statement_timeout": prior_statement_ms, "idle_timeout": prior_idle_ms},
                )

    @contextmanager
    def lease_watched(self) -> Iterator[None]:
        """Run the block's statements (one that may rightly outlast the lease left when it
        starts, like a REINDEX) without a statement timeout, under a watchdog that cancels
        the statement under way as soon as this process no longer holds the lease or the
        service stops. The watchdog is this process's: for a process that is paused, the
        statement runs on, and the caller must say why that is safe."""
        connection = connections[eddyq_settings.DATABASE]
        connection.ensure_connection()
        raw = connection.connection
        ended = threading.Event()

        def watch() -> None:
            while not ended.wait(WATCHDOG_SECONDS):
                if self.lease_left() <= 0 or self.stopping:
                    raw.cancel_safe()
                    return

        watchdog = threading.Thread(target=watch, name=f"eddyq-{self.name}-watchdog", daemon=True)
        self._watched.set()
        watchdog.start()
        try:
            yield
        finally:
            self._watched.clear()
            ended.set()
            watchdog.join()

    def on_notification(self, _payload: str) -> None:
        self.wake()

    def on_failure(self) -> None:
        # A broken connection is replaced on the next pass.
        connections[eddyq_settings.DATABASE].close()

    def on_stop(self) -> None:
        connections[eddyq_settings.DATABASE].close()

    def database_now(self) -> datetime:
        """Now by the database's clock, in UTC: schedules are reckoned by it, never by the
        clock of the process that happens to lead."""
        with self.cursor() as cursor:
            return database_now(cursor)

    @staticmethod
    @contextmanager
    def cursor() -> Iterator[CursorWrapper]:
        with connections[eddyq_settings.DATABASE].cursor() as cursor:
            yield cursor

    @staticmethod
    def atomic() -> Any:
        return transaction.atomic(using=eddyq_settings.DATABASE)
