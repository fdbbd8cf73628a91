"""Chancy (https://tkte.ch/chancy/) as a benchmark subject.

Set up per its docs: ``await chancy.migrate()``, then one queue declared with
``Queue("default", concurrency=<concurrency>, executor=Chancy.Executor.Async, eager_polling=True,
polling_interval=1)`` — async no-op jobs on its asyncio executor (its default, a process pool,
is meant for CPU-bound work), polling again as soon as a job ends instead of after the interval
(without it a drain fetches ten jobs per interval). Its default plugins stay on. Enqueued with
``await chancy.push(job)`` and ``chancy.push_many(jobs, batch_size=chunk)``; the worker is
``Worker(chancy)`` in a process of its own. Chancy's logger is set to WARNING as everyone's is
(at its default, INFO, it logs a line per job).

Chancy has no burst mode: a drain ends when polling sees no pending or running job. A worker
sends finished jobs' updates in batches about once a second, so that is when they are durable.

The options (``OPTIONS``): ``concurrency``, the jobs a worker runs at once from the queue, the
one throughput setting of a ``Queue`` (the executor and eager polling above are already the
docs' choice for short async jobs; ``Queue``'s docstring, tkte.ch/chancy). "defaults" is 10, as
django-eddyq's reference row; ``"best"`` is the fastest drain that
``python -m benchmarks.peer_options chancy`` measured among ``CANDIDATES``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

from chancy import Chancy, Job, Queue, Worker

from benchmarks import common, harness

MODULE = "benchmarks.peers.chancy"
NOOP = Job(func=f"{MODULE}.noop")

#: Option sets by name (``run.py --peer-options``): the defaults used here, and the best.
OPTIONS: dict[str, dict[str, Any]] = {
    "defaults": {"concurrency": 10},
    "best": {"concurrency": 100},
}
#: What ``benchmarks/peer_options.py`` tries, to choose "best".
CANDIDATES: list[dict[str, Any]] = [{"concurrency": n} for n in (10, 30, 100, 300)]


async def noop() -> None:
    """Does nothing."""


async def probe(key: int) -> None:
    common.record_start(key)


def app() -> Chancy:
    log = logging.getLogger("chancy")
    log.setLevel(logging.WARNING)
    log.addHandler(logging.StreamHandler())
    return Chancy(os.environ["DATABASE_URL"], log=log)


class ChancySubject(harness.Subject):
    name = "chancy"
    worker_exits = False
    tables = ("chancy_jobs",)

    def __init__(self, url: str, env: dict[str, str], options: dict[str, Any]) -> None:
        super().__init__(url, env)
        self.options = options
        self.loop = asyncio.new_event_loop()
        self.chancy = app()
        self.loop.run_until_complete(self.chancy.__aenter__())

    def close(self) -> None:
        self.loop.run_until_complete(self.chancy.__aexit__(None, None, None))
        self.loop.close()
        super().close()

    def setup(self) -> None:
        async def run() -> None:
            await self.chancy.migrate()
            await self.chancy.declare(
                Queue(
                    "default",
                    concurrency=self.options["concurrency"],
                    executor=Chancy.Executor.Async,
                    polling_interval=1,
                    eager_polling=True,
                ),
                upsert=True,
            )

        self.loop.run_until_complete(run())

    def reset(self) -> None:
        self.connection.execute("TRUNCATE chancy_jobs")

    def enqueue_single(self, n: int) -> None:
        async def run() -> None:
            for _ in range(n):
                await self.chancy.push(NOOP)

        self.loop.run_until_complete(run())

    def enqueue_many(self, n: int, chunk: int) -> None:
        async def run() -> None:
            async for _ in self.chancy.push_many([NOOP] * n, batch_size=chunk):
                pass

        self.loop.run_until_complete(run())

    def enqueue_probe(self, key: int) -> None:
        job = Job(func=f"{MODULE}.probe", kwargs={"key": key})
        self.loop.run_until_complete(self.chancy.push(job))

    def worker_argv(self, mode: str, options: dict[str, Any]) -> list[str]:
        return [sys.executable, "-m", MODULE, "worker", json.dumps({"mode": mode})]

    def count(self) -> int:
        return self.scalar("SELECT count(*) FROM chancy_jobs")

    def pending(self) -> int:
        return self.scalar(
            "SELECT count(*) FROM chancy_jobs WHERE state IN ('pending', 'running', 'retrying')"
        )

    def completed(self) -> int:
        return self.scalar("SELECT count(*) FROM chancy_jobs WHERE state = 'succeeded'")


async def run_worker() -> None:
    async with app() as chancy, Worker(chancy) as worker:
        await worker.wait_for_shutdown()


def worker(config: dict[str, Any]) -> dict[str, Any]:
    asyncio.run(run_worker())
    return {"ok": True}


def subject(config: dict[str, Any]) -> ChancySubject:
    options = harness.chosen_options(OPTIONS, config)
    return ChancySubject(os.environ["DATABASE_URL"], dict(os.environ), options)


def setup(config: dict[str, Any]) -> dict[str, Any]:
    queue = subject(config)
    queue.setup()
    queue.close()
    return {"ok": True, "options": queue.options}


def run_round(config: dict[str, Any]) -> dict[str, Any]:
    return harness.standard_round(subject(config), config)


if __name__ == "__main__":
    common.subject_main({"setup": setup, "round": run_round, "worker": worker})
