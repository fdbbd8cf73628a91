"""``--processes P``: several worker processes under one supervisor.

The supervisor runs no jobs and holds no database connection. It forks its children after
Django is set up and the tasks are imported (so they share that memory), forwards stop signals
to them, restarts a child that dies, waiting longer after each quick death, and returns once
every child has stopped. A child whose every handler thread is stuck past its timeout exits with
``STUCK_EXIT_CODE`` (see ``Worker``), and is restarted like one that died. A child that was
recycled (``--max-jobs``, ``--max-memory``) says so before it exits, and is replaced at once.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from multiprocessing.context import ForkProcess
from multiprocessing.synchronize import Event

from django.db import connections

from django_eddyq.worker.signals import (
    GRACEFUL_STOP_FROM_SUPERVISOR,
    IMMEDIATE_STOP_FROM_SUPERVISOR,
    handle_signals,
    stop_signal_actions,
    supervisor_signal_actions,
)
from django_eddyq.worker.worker import STUCK_EXIT_CODE, Worker, run_in_this_process

logger = logging.getLogger(__name__)

# A child that dies is restarted after a wait that doubles with each death in a row, up to the
# cap; one that ran longer than HEALTHY_SECONDS starts the count again.
RESTART_FIRST_SECONDS = 1.0
RESTART_MAX_SECONDS = 60.0
HEALTHY_SECONDS = 60.0
POLL_SECONDS = 0.2


class Supervisor:
    def __init__(
        self,
        processes: int,
        make_worker: Callable[[], Worker],
        after: Callable[[Worker], None] | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, not {processes}")
        self.processes = processes
        self.make_worker = make_worker
        self.after = after  # run in each worker process once its worker has stopped
        self._context = multiprocessing.get_context("fork")
        # slot -> the process, when it started, and whether it was recycled (it sets it itself:
        # an exit status could be a handler's os._exit()).
        self._children: dict[int, tuple[ForkProcess, float, Event]] = {}
        self._deaths_in_a_row: dict[int, int] = {}
        self._restart_at: dict[int, float] = {}
        self._stopping = False
        self._signal_to_forward: int | None = None

    def run(self) -> int:
        handle_signals(
            stop_signal_actions(self.stop, who="supervisor", before_exit=self._stop_children_now)
        )
        for slot in range(self.processes):
            self._spawn(slot)
        while self._children or (self._restart_at and not self._stopping):
            self._reap()
            self._restart_due()
            time.sleep(POLL_SECONDS)
        logger.info("eddyq supervisor: all %d worker processes stopped", self.processes)
        return 0

    def stop(self) -> None:
        """Stop every child gracefully; ``run`` returns once they all have."""
        self._stopping = True
        self._restart_at.clear()
        self._signal_children(GRACEFUL_STOP_FROM_SUPERVISOR)

    def _stop_children_now(self) -> None:
        self._signal_children(IMMEDIATE_STOP_FROM_SUPERVISOR)

    def _signal_children(self, which: signal.Signals) -> None:
        for process, _started, _recycled in self._children.values():
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, which)

    def _spawn(self, slot: int) -> None:
        # A forked child must not share the parent's database sockets.
        connections.close_all()
        recycled = self._context.Event()
        process = self._context.Process(
            target=self._child_main, args=(recycled,), name=f"eddyq-worker-{slot}"
        )
        process.start()
        self._children[slot] = (process, time.monotonic(), recycled)
        logger.info("eddyq supervisor: started worker process %s (slot %d)", process.pid, slot)

    def _child_main(self, recycled: Event) -> None:
        # Its own process group: a Ctrl-C in the terminal reaches only the supervisor, which
        # passes it on as its own signal.
        os.setpgrp()
        # The supervisor's wakeup socket is not this process's to write to.
        signal.set_wakeup_fd(-1)
        supervisor_pid = os.getppid()
        worker = self.make_worker()
        who = f"worker {worker.id}"
        handle_signals(
            stop_signal_actions(worker.stop, who=who)
            | supervisor_signal_actions(worker.stop, who=who)
        )
        threading.Thread(
            target=_stop_when_orphaned, args=(worker, supervisor_pid), daemon=True
        ).start()
        run_in_this_process(worker, partial(self._child_stopped, recycled))

    def _child_stopped(self, recycled: Event, worker: Worker) -> None:
        if worker.recycled:
            recycled.set()
        if self.after is not None:
            self.after(worker)

    def _reap(self) -> None:
        for slot, (process, started, recycled) in list(self._children.items()):
            if process.is_alive():
                continue
            process.join()
            del self._children[slot]
            if self._stopping:
                continue
            if process.exitcode == 0:
                if recycled.is_set():
                    logger.info(
                        "eddyq supervisor: worker process %s was recycled; starting another",
                        process.pid,
                    )
                    self._deaths_in_a_row.pop(slot, None)
                    self._spawn(slot)
                continue
            lived = time.monotonic() - started
            deaths = 1 if lived > HEALTHY_SECONDS else self._deaths_in_a_row.get(slot, 0) + 1
            self._deaths_in_a_row[slot] = deaths
            wait = min(RESTART_FIRST_SECONDS * 2 ** (deaths - 1), RESTART_MAX_SECONDS)
            self._restart_at[slot] = time.monotonic() + wait
            logger.warning(
                "eddyq supervisor: worker process %s died (exit code %s%s); restarting in %.0fs",
                process.pid,
                process.exitcode,
                ": every slot stuck past its timeout"
                if process.exitcode == STUCK_EXIT_CODE
                else "",
                wait,
            )

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot, when in list(self._restart_at.items()):
            if now >= when and not self._stopping:
                del self._restart_at[slot]
                self._spawn(slot)


def _stop_when_orphaned(worker: Worker, supervisor_pid: int) -> None:
    """A child whose supervisor was killed stops gracefully rather than running on unsupervised."""
    while os.getppid() == supervisor_pid:
        time.sleep(POLL_SECONDS * 5)
    logger.warning("eddyq worker %s: its supervisor is gone, stopping", worker.id)
    worker.stop()
