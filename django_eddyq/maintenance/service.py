"""What every maintenance service shares: its interval setting, its connection, its guard."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar

from django.db import connections, transaction
from django.db.backends.utils import CursorWrapper

from django_eddyq.conf import eddyq_settings
from django_eddyq.lifecycle import Loop

logger = logging.getLogger("django_eddyq")


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
        # Set by the elector: a pass only starts while this process holds the leader lease.
        self.may_run: Callable[[], bool] = lambda: True
        # The worker id of the elector that runs it, for the logs.
        self.leader_id = ""

    def interval(self) -> float | None:
        value = getattr(eddyq_settings, self.interval_setting)
        return None if value is None else float(value.total_seconds())

    def run_once(self, now: datetime | None = None) -> int:
        raise NotImplementedError

    def loop_pass(self) -> int:
        """A pass as the loop runs it: skipped unless this process may run maintenance."""
        if not self.may_run():
            return 0
        started = time.time()
        count = self.run_once()
        if count:
            logger.info("eddyq %s: %d %s", self.name, count, self.verb)
        # Each pass's leader and time window: what an audit of "never two leaders" reads.
        logger.debug(
            "eddyq %s: pass by leader %s from %.6f to %.6f",
            self.name,
            self.leader_id,
            started,
            time.time(),
        )
        return count

    def on_notification(self, _payload: str) -> None:
        self.wake()

    def on_failure(self) -> None:
        # A broken connection is replaced on the next pass.
        connections[eddyq_settings.DATABASE].close()

    def on_stop(self) -> None:
        connections[eddyq_settings.DATABASE].close()

    @staticmethod
    @contextmanager
    def cursor() -> Iterator[CursorWrapper]:
        with connections[eddyq_settings.DATABASE].cursor() as cursor:
            yield cursor

    @staticmethod
    def atomic() -> Any:
        return transaction.atomic(using=eddyq_settings.DATABASE)
