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


# What a supervisor sends its worker processes: signals of their own, so that a worker that
# also gets SIGTERM from elsewhere (systemd signals the whole control group) never counts the
# supervisor's request as a second, "exit now" signal.
GRACEFUL_STOP_FROM_SUPERVISOR = signal.SIGUSR1
IMMEDIATE_STOP_FROM_SUPERVISOR = signal.SIGUSR2


def on_supervisor_signals(graceful_stop: Callable[[], None], *, who: str) -> None:
    def stop_gracefully(signum: int, frame: FrameType | None) -> None:
        logger.info("eddyq %s: asked to stop by its supervisor", who)
        graceful_stop()

    def stop_now(signum: int, frame: FrameType | None) -> None:
        logger.warning("eddyq %s: told to exit now by its supervisor", who)
        logging.shutdown()
        os._exit(1)

    signal.signal(GRACEFUL_STOP_FROM_SUPERVISOR, stop_gracefully)
    signal.signal(IMMEDIATE_STOP_FROM_SUPERVISOR, stop_now)
