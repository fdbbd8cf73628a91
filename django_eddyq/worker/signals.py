"""Signal handling shared by a worker process and the supervisor of several.

Python runs a signal handler on the main thread between two bytecodes, even in the middle of
another handler or of ``Event.set()``: a handler that touches a lock can deadlock its own
thread. So the handlers here do nothing in Python; ``signal.set_wakeup_fd`` has the interpreter
write each signal's number to a socket, and a thread of our own reads it and acts.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from types import FrameType

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# What a supervisor sends its worker processes: signals of their own, so that a worker that
# also gets SIGTERM from elsewhere (systemd signals the whole control group) never counts the
# supervisor's request as a second, "exit now" signal.
GRACEFUL_STOP_FROM_SUPERVISOR = signal.SIGUSR1
IMMEDIATE_STOP_FROM_SUPERVISOR = signal.SIGUSR2


_wakeup_sockets: list[socket.socket] = []


def exit_now(who: str, reason: str) -> None:
    logger.warning("eddyq %s: %s, exiting now", who, reason)
    logging.shutdown()
    os._exit(1)


def handle_signals(actions: Mapping[signal.Signals, Callable[[], None]]) -> None:
    """Run ``actions[signum]()`` on a thread of its own whenever that signal arrives.

    Call it from the main thread, once per process.
    """
    receiver, sender = socket.socketpair()
    sender.setblocking(False)
    # Kept open for the life of the process: the interpreter writes to the bare fd number, which
    # a closed socket would hand on to the next connection opened.
    _wakeup_sockets.append(sender)
    signal.set_wakeup_fd(sender.fileno(), warn_on_full_buffer=False)

    def ignore_in_python(signum: int, frame: FrameType | None) -> None:
        """The wakeup fd does the work; a Python-level handler must exist for it to fire."""

    for signum in actions:
        signal.signal(signum, ignore_in_python)

    def dispatch() -> None:
        while data := receiver.recv(64):
            for number in data:
                action = actions.get(signal.Signals(number))
                if action is not None:
                    action()

    threading.Thread(target=dispatch, name="eddyq-signals", daemon=True).start()


def stop_signal_actions(
    graceful_stop: Callable[[], None],
    *,
    who: str,
    before_exit: Callable[[], None] | None = None,
) -> dict[signal.Signals, Callable[[], None]]:
    """The first SIGTERM/SIGINT stops gracefully; a second one exits at once with status 1."""
    received = 0

    def on_stop_signal(name: str) -> Callable[[], None]:
        def act() -> None:
            nonlocal received
            received += 1
            if received == 1:
                logger.info("eddyq %s: %s received, stopping gracefully", who, name)
                graceful_stop()
                return
            if before_exit is not None:
                before_exit()
            exit_now(who, f"second {name} received")

        return act

    return {stop_signal: on_stop_signal(stop_signal.name) for stop_signal in STOP_SIGNALS}


def supervisor_signal_actions(
    graceful_stop: Callable[[], None], *, who: str
) -> dict[signal.Signals, Callable[[], None]]:
    """How a worker process obeys its supervisor."""

    def stop_gracefully() -> None:
        logger.info("eddyq %s: asked to stop by its supervisor", who)
        graceful_stop()

    return {
        GRACEFUL_STOP_FROM_SUPERVISOR: stop_gracefully,
        IMMEDIATE_STOP_FROM_SUPERVISOR: lambda: exit_now(who, "told to by its supervisor"),
    }
