"""Signal handling shared by a worker process and the supervisor of several."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger("django_eddyq")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signals(
    graceful_stop: Callable[[], None],
    *,
    who: str,
    before_exit: Callable[[], None] | None = None,
) -> None:
    """The first SIGTERM/SIGINT stops gracefully; a second one exits at once with status 1."""
    received = 0

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal received
        received += 1
        name = signal.Signals(signum).name
        if received == 1:
            logger.info("eddyq %s: %s received, stopping gracefully", who, name)
            graceful_stop()
        else:
            logger.warning("eddyq %s: second %s received, exiting now", who, name)
            if before_exit is not None:
                before_exit()
            logging.shutdown()
            os._exit(1)

    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, handle)


def restore_default_signals() -> None:
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_DFL)
