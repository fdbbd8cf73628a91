"""Procrastinate (https://procrastinate.readthedocs.io) as a benchmark subject.

Set up per its docs: ``App(connector=PsycopgConnector(...))``, the schema applied with
``app.schema_manager.apply_schema()``. Jobs are async no-op tasks; enqueued with the sync API
(``task.defer()``, ``task.batch_defer()``); the worker is ``app.run_worker()`` in a process of its
own, concurrency 10, LISTEN/NOTIFY on, ``wait=False`` for a drain (it exits once caught up).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import procrastinate

from benchmarks import common, harness

MODULE = "benchmarks.peers.procrastinate"

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("DATABASE_URL", ""))
)


@app.task(name="noop")
async def noop() -> None:
    """Does nothing."""


@app.task(name="probe")
async def probe(key: int) -> None:
    common.record_start(key)


class Procrastinate(harness.Subject):
    name = "procrastinate"
    worker_exits = True
    tables = ("procrastinate_jobs", "procrastinate_events")

    def __init__(self, url: str, env: dict[str, str]) -> None:
        super().__init__(url, env)
        app.open()

    def close(self) -> None:
        app.close()
        super().close()

    def setup(self) -> None:
        app.schema_manager.apply_schema()

    def reset(self) -> None:
        self.connection.execute("TRUNCATE procrastinate_jobs, procrastinate_events CASCADE")

    def enqueue_single(self, n: int) -> None:
        for _ in range(n):
            noop.defer()

    def enqueue_many(self, n: int, chunk: int) -> None:
        for start in range(0, n, chunk):
            noop.batch_defer(*({} for _ in range(min(chunk, n - start))))

    def enqueue_probe(self, key: int) -> None:
        probe.defer(key=key)

    def worker_argv(self, mode: str, options: dict[str, Any]) -> list[str]:
        return [sys.executable, "-m", MODULE, "worker", json.dumps({"mode": mode})]

    def count(self) -> int:
        return self.scalar("SELECT count(*) FROM procrastinate_jobs")

    def pending(self) -> int:
        return self.scalar(
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        )

    def completed(self) -> int:
        return self.scalar("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")

    def last_completion(self) -> float | None:
        return self.scalar(
            "SELECT extract(epoch FROM max(at))::float8 FROM procrastinate_events"
            " WHERE type = 'succeeded'"
        )


def worker(config: dict[str, Any]) -> dict[str, Any]:
    app.run_worker(concurrency=10, wait=config["mode"] != "drain", listen_notify=True)
    return {"ok": True}


def subject() -> Procrastinate:
    return Procrastinate(os.environ["DATABASE_URL"], dict(os.environ))


def setup(config: dict[str, Any]) -> dict[str, Any]:
    queue = subject()
    queue.setup()
    queue.close()
    return {"ok": True, "version": common.version("procrastinate")}


def run_round(config: dict[str, Any]) -> dict[str, Any]:
    return harness.standard_round(subject(), config)


if __name__ == "__main__":
    common.subject_main({"setup": setup, "round": run_round, "worker": worker})
