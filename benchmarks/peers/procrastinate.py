"""Procrastinate (https://procrastinate.readthedocs.io) as a benchmark subject.

Set up per its docs: ``App(connector=PsycopgConnector(...))``, the schema applied with
``app.schema_manager.apply_schema()``. Jobs are async no-op tasks; enqueued with the sync API
(``task.defer()``, ``task.batch_defer()``); the worker is ``app.run_worker()`` in a process of its
own, LISTEN/NOTIFY on, ``wait=False`` for a drain (it exits once caught up).

The options (``OPTIONS``), from Procrastinate's docs (procrastinate.readthedocs.io):

* ``concurrency``: ``run_worker(concurrency=...)``, the sub-workers of one worker, its only
  throughput setting ("Execute multiple jobs at the same time", ``howto/production/
  concurrency.md``, whose example is 30). The library's default is 1; "defaults" is 10, as
  django-eddyq's reference row.
* ``pool_max_size``: the worker's ``PsycopgConnector(max_size=...)``, the size of its psycopg
  pool ("Limit the number of opened connections", ``howto/production/connections.md``); None
  leaves psycopg_pool's default.

Left out: ``delete_jobs="always"`` (a finished job is deleted rather than kept), since the other
subjects keep their finished jobs or a log of them. ``"best"`` is the fastest drain that
``python -m benchmarks.peer_options procrastinate`` measured among ``CANDIDATES``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import procrastinate

from benchmarks import common, harness

MODULE = "benchmarks.peers.procrastinate"

#: Option sets by name (``run.py --peer-options``): the library's defaults, and its best.
OPTIONS: dict[str, dict[str, Any]] = {
    "defaults": {"concurrency": 10, "pool_max_size": None},
    "best": {"concurrency": 30, "pool_max_size": None},
}
#: What ``benchmarks/peer_options.py`` tries, to choose "best".
CANDIDATES: list[dict[str, Any]] = [
    {"concurrency": 10, "pool_max_size": None},
    {"concurrency": 30, "pool_max_size": None},
    {"concurrency": 30, "pool_max_size": 30},
    {"concurrency": 100, "pool_max_size": 100},
]

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

    def __init__(self, url: str, env: dict[str, str], options: dict[str, Any]) -> None:
        super().__init__(url, env)
        self.options = options
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
        config = {"mode": mode, "options": self.options}
        return [sys.executable, "-m", MODULE, "worker", json.dumps(config)]

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
    options = config["options"]
    pool = {} if options["pool_max_size"] is None else {"max_size": options["pool_max_size"]}
    connector = procrastinate.PsycopgConnector(conninfo=os.environ["DATABASE_URL"], **pool)
    with app.replace_connector(connector):
        app.run_worker(
            concurrency=options["concurrency"],
            wait=config["mode"] != "drain",
            listen_notify=True,
        )
    return {"ok": True}


def subject(config: dict[str, Any]) -> Procrastinate:
    options = harness.chosen_options(OPTIONS, config)
    return Procrastinate(os.environ["DATABASE_URL"], dict(os.environ), options)


def setup(config: dict[str, Any]) -> dict[str, Any]:
    queue = subject(config)
    queue.setup()
    queue.close()
    return {"ok": True, "version": common.version("procrastinate"), "options": queue.options}


def run_round(config: dict[str, Any]) -> dict[str, Any]:
    return harness.standard_round(subject(config), config)


if __name__ == "__main__":
    common.subject_main({"setup": setup, "round": run_round, "worker": worker})
