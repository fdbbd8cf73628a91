"""PgQueuer (https://pgqueuer.readthedocs.io) as a benchmark subject.

Set up per its docs: ``Queries(driver).install()`` with the default durability (every table
logged). Enqueued with ``await Queries.enqueue(...)``: a scalar entrypoint for one job, lists for
many. The worker is a ``QueueManager`` over one connection with async entrypoints; for a drain,
``mode=QueueExecutionMode.drain`` (it exits once the queue is empty). A finished job is deleted
from ``pgqueuer`` and logged in ``pgqueuer_log`` (whose ``created`` is the completion time).

The options (``OPTIONS``), from PgQueuer's docs (github.com/janbjorge/pgqueuer, ``docs/``):

* ``driver``: ``"psycopg"`` (``PsycopgDriver`` over a psycopg ``AsyncConnection`` in
  autocommit) or ``"asyncpg"`` (``AsyncpgDriver`` over one asyncpg connection).
  ``comparisons/benchmarks.md``: asyncpg "roughly 1.7x the throughput of psycopg";
  ``guides/performance-tuning.md``: "a single connection for QueueManager" (a pool is advised
  for producers that share it; ours enqueue one call at a time, so one connection).
* ``uvloop``: the event loop of the enqueuing process and of the worker. PgQueuer depends on
  uvloop and its own CLI (``pgq run``) runs on it whenever it is installed.
* ``batch_size``: ``QueueManager.run(batch_size=...)``, jobs fetched per dequeue, default 10;
  ``guides/performance-tuning.md``: "Increase batch_size when jobs are short-lived".
* ``autovac``: ``Queries.optimize_autovacuum()`` after install (``pgq autovac``, first item of
  that page's checklist: autovacuum at 1 % dead tuples, fillfactor 70).

Left out: the ``balanced`` and ``volatile`` durability levels (unlogged tables, jobs lost on a
crash), since every subject here is durable. ``"best"`` is the fastest drain that
``python -m benchmarks.peer_options pgqueuer`` measured among ``CANDIDATES``
(docs/performance.md has the table).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import asyncpg
import psycopg
import uvloop
from pgqueuer import AsyncpgDriver, PsycopgDriver, Queries, QueueManager
from pgqueuer.models import Job
from pgqueuer.types import QueueExecutionMode

from benchmarks import common, harness

MODULE = "benchmarks.peers.pgqueuer"

#: Option sets by name (``run.py --peer-options``): the library's defaults, and its best.
OPTIONS: dict[str, dict[str, Any]] = {
    "defaults": {"driver": "psycopg", "uvloop": False, "batch_size": 10, "autovac": False},
    "best": {"driver": "asyncpg", "uvloop": True, "batch_size": 1000, "autovac": True},
}
#: What ``benchmarks/peer_options.py`` tries, to choose "best".
CANDIDATES: list[dict[str, Any]] = [
    {"driver": driver, "uvloop": loop, "batch_size": batch_size, "autovac": False}
    for driver in ("psycopg", "asyncpg")
    for loop in (False, True)
    for batch_size in (10, 100, 500, 1000)
]
if OPTIONS["best"] not in CANDIDATES:  # the grid's fastest with autovac on top
    CANDIDATES.append(OPTIONS["best"])


def new_loop(options: dict[str, Any]) -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop() if options["uvloop"] else asyncio.new_event_loop()


async def connect(url: str, options: dict[str, Any]) -> tuple[Any, Any]:
    """A connection in the chosen driver (autocommit, as PgQueuer requires) and its driver."""
    if options["driver"] == "asyncpg":
        connection = await asyncpg.connect(url)
        return connection, AsyncpgDriver(connection)
    connection = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return connection, PsycopgDriver(connection)


class PgQueuer(harness.Subject):
    name = "pgqueuer"
    worker_exits = True
    tables = ("pgqueuer", "pgqueuer_log")

    def __init__(self, url: str, env: dict[str, str], options: dict[str, Any]) -> None:
        super().__init__(url, env)
        self.options = options
        self.loop = new_loop(options)
        self.async_connection, driver = self.loop.run_until_complete(connect(url, options))
        self.queries = Queries(driver)

    def close(self) -> None:
        self.loop.run_until_complete(self.async_connection.close())
        self.loop.close()
        super().close()

    def setup(self) -> None:
        self.loop.run_until_complete(self.queries.install())
        if self.options["autovac"]:
            self.loop.run_until_complete(self.queries.optimize_autovacuum())

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
        config = {"mode": mode, "options": self.options}
        return [sys.executable, "-m", MODULE, "worker", json.dumps(config)]

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


async def run_worker(mode: str, options: dict[str, Any]) -> None:
    _, driver = await connect(os.environ["DATABASE_URL"], options)
    qm = QueueManager(Queries(driver))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        """Does nothing."""

    @qm.entrypoint("probe")
    async def probe(job: Job) -> None:
        common.record_start(int(job.payload or b"0"))

    execution = QueueExecutionMode.drain if mode == "drain" else QueueExecutionMode.continuous
    await qm.run(batch_size=options["batch_size"], mode=execution)


def worker(config: dict[str, Any]) -> dict[str, Any]:
    options = config["options"]
    run = uvloop.run if options["uvloop"] else asyncio.run
    run(run_worker(config["mode"], options))
    return {"ok": True}


def subject(config: dict[str, Any]) -> PgQueuer:
    options = harness.chosen_options(OPTIONS, config)
    return PgQueuer(os.environ["DATABASE_URL"], dict(os.environ), options)


def setup(config: dict[str, Any]) -> dict[str, Any]:
    queue = subject(config)
    queue.setup()
    queue.close()
    return {"ok": True, "options": queue.options}


def run_round(config: dict[str, Any]) -> dict[str, Any]:
    return harness.standard_round(subject(config), config)


if __name__ == "__main__":
    common.subject_main({"setup": setup, "round": run_round, "worker": worker})
