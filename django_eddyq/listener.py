"""One LISTEN connection per process, fanning notifications out to whoever subscribed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from psycopg import sql as psql

from django_eddyq import db, sql
from django_eddyq.lifecycle import Loop

logger = logging.getLogger(__name__)

# How long one wait for notifications lasts before the loop checks whether it should stop.
LISTEN_TIMEOUT_SECONDS = 1.0
RECONNECT_SECONDS = 1.0

Subscriber = Callable[[str], None]


class Listener(Loop):
    """Delivers each notification's payload to the subscribers of its channel.

    Notifications are hints, never the only way work is found: while this connection is down,
    subscribers still poll, so nothing is lost with it.
    """

    name = "listener"

    def __init__(self) -> None:
        super().__init__()
        self._subscribers: dict[str, list[Subscriber]] = {}

    def subscribe(self, channel: str, subscriber: Subscriber) -> None:
        """Subscribe before ``start()``."""
        self._subscribers.setdefault(channel, []).append(subscriber)

    def interval(self) -> float:
        return RECONNECT_SECONDS

    def run_once(self, now: datetime | None = None) -> int:
        """Listen until stopped; returns (to be retried by the loop) when the connection fails."""
        delivered = 0
        with db.connect() as connection:
            for channel in self._subscribers:
                connection.execute(psql.SQL(sql.LISTEN).format(channel=psql.Identifier(channel)))
            while not self.stopping:
                # Returns at the timeout, so that a stop is noticed within it.
                for notification in connection.notifies(timeout=LISTEN_TIMEOUT_SECONDS):
                    for subscriber in self._subscribers.get(notification.channel, ()):
                        subscriber(notification.payload)
                    delivered += 1
        return delivered
