"""PgQueuer (https://pgqueuer.readthedocs.io) as a benchmark subject.

Set up per its docs: ``Queries(PsycopgDriver(connection)).install()`` with the default durability
(every table logged). Enqueued with ``await Queries.enqueue(...)``: a scalar entrypoint for one
job, lists for many. The worker is a ``QueueManager`` over a psycopg ``AsyncConnection``
(autocommit, as it requires) with async entrypoints, its default ``batch_size=10``; for a drain,
``mode=QueueExecutionMode.drain`` (it exits once the queue is empty). A finished job is deleted
from ``pgqueuer`` and logged in ``pgqueuer_log`` (whose ``created`` is the completion time).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import psycopg
from pgqueuer import PsycopgDriver, Queries, QueueManager
from pgqueuer.models import Job
from pgqueuer.types import QueueExecutionMode

from benchmarks import common, harness

MODULE = "benchmarks.peers.pgqueuer"


class PgQueuer(harness.Subject):
    name = "pgqueuer"
    worker_exits = True
    tables = ("pgqueuer", "pgqueuer_log")

    def __init__(self, url: str, env: dict[str, str]) -> None:
        super().__init__(url, env)
        self.loop = asyncio.new_event_loop()
        self.async_connection = self.loop.run_until_complete(
            psycopg.AsyncConnection.connect(url, autocommit=True)
        )
        self.queries = Queries(PsycopgDriver(self.async_connection))

    def close(self) -> None:
        self.loop.run_until_complete(self.async_connection.close())
        self.loop.close()
        super().close()

    def setup(self) -> None:
        self.loop.run_until_complete(self.queries.install())

    def reset(self) -> None:
        self.connection.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")

    def enqueue_single(self, n: int) -> None:
        async def run() -> None:
            for _ in range(n):
                await self.queries.enqueue("noop", None)

        self.loop.run_until_complete(run())

    def enqueue_many(self, n: int, chunk: int) -> None:
        async def run() -> None:
            for start in range(0, n, chunk):
                size = min(chunk, n - start)
                await self.queries.enqueue(["noop"] * size, [None] * size, [0] * size)

        self.loop.run_until_complete(run())

    def enqueue_probe(self, key: int) -> None:
        self.loop.run_until_complete(self.queries.enqueue("probe", str(key).encode()))

    def worker_argv(self, mode: str, options: dict[str, Any]) -> list[str]:
        return [sys.executable, "-m", MODULE, "worker", json.dumps({"mode": mode})]

    def count(self) -> int:
        return self.scalar("SELECT count(*) FROM pgqueuer")

    def pending(self) -> int:
        return self.scalar("SELECT count(*) FROM pgqueuer")

    def completed(self) -> int:
        return self.scalar("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")

    def last_completion(self) -> float | None:
        return self.scalar(
            "SELECT extract(epoch FROM max(created))::float8 FROM pgqueuer_log"
            " WHERE status = 'successful'"
        )


async def run_worker(mode: str) -> None:
    connection = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(connection)))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        """Does nothing."""

    @qm.entrypoint("probe")
    async def probe(job: Job) -> None:
        common.record_start(int(job.payload or b"0"))

    execution = QueueExecutionMode.drain if mode == "drain" else QueueExecutionMode.continuous
    await qm.run(mode=execution)


def worker(config: dict[str, Any]) -> dict[str, Any]:
    asyncio.run(run_worker(config["mode"]))
    return {"ok": True}


def subject() -> PgQueuer:
    return PgQueuer(os.environ["DATABASE_URL"], dict(os.environ))


def setup(config: dict[str, Any]) -> dict[str, Any]:
    queue = subject()
    queue.setup()
    queue.close()
    return {"ok": True}


def run_round(config: dict[str, Any]) -> dict[str, Any]:
    return harness.standard_round(subject(), config)


if __name__ == "__main__":
    common.subject_main({"setup": setup, "round": run_round, "worker": worker})
