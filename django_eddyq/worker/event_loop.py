"""The worker's event loop: a thread of its own, on which handler threads run async handlers."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from concurrent.futures import wait as wait_until_done
from typing import Any

from django_eddyq import current
from django_eddyq.handlers import Handler
from django_eddyq.worker.execution import Outcome, RunningJob, failure, run_async

logger = logging.getLogger(__name__)

# How long stopping waits for the event loop's thread, then for its cancelled tasks.
EVENT_LOOP_STOP_SECONDS = 2.0


class EventLoop:
    """An asyncio event loop, run forever on a daemon thread until ``close``."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="eddyq-event-loop", daemon=True
        )
        self._thread.start()

    def run(self, running: RunningJob, handler: Handler) -> Outcome:
        """Run an async handler's job on the loop, and wait for its outcome: on a handler
        thread, which holds its slot meanwhile."""
        assert self.loop is not None
        done = asyncio.run_coroutine_threadsafe(
            _run_async_job(running, run_async(running.job, handler)), self.loop
        )
        running.future = done
        wait_until_done([done])
        # A cancelled future or a BaseException from the handler still ends as an outcome.
        error = asyncio.CancelledError() if done.cancelled() else done.exception()
        return failure(running.job, handler, error) if error else done.result()

    def cancel(self, task: asyncio.Task[Outcome]) -> None:
        """Cancel ``task``, from another thread."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(task.cancel)

    def close(self) -> None:
        """Stop the loop, cancel the tasks left on it, and close it.

        A handler that blocks the loop's thread keeps it from stopping: then the loop is left
        as it is (its thread is a daemon) rather than holding up the stop.
        """
        loop, thread = self.loop, self._thread
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(EVENT_LOOP_STOP_SECONDS)
            if thread.is_alive():
                logger.warning(
                    "eddyq worker %s: its event loop is blocked by a handler; left unclosed",
                    self.worker_id,
                )
                return
        try:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=EVENT_LOOP_STOP_SECONDS))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except Exception:
            logger.exception("eddyq worker %s: shutting its event loop down failed", self.worker_id)
        finally:
            # Also shuts the loop's default executor down, without waiting for its threads.
            loop.close()


async def _run_async_job(running: RunningJob, run: Coroutine[Any, Any, Outcome]) -> Outcome:
    current.enter(running.job, running.cancel)  # in the task's own context
    running.task = asyncio.current_task()
    return await run
