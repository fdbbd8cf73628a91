"""Soak: many jobs through one long-running worker; the table's health and the worker's memory.

One ``manage.py eddyq_worker`` (``concurrency`` from the config, 10 by default) runs throughout
(not ``--burst``: one process, so its memory tells whether anything accumulates per job). This
process tops the queue up with ``enqueue_many`` of ``chunk`` jobs whenever fewer than ``backlog``
wait, until ``jobs`` have been enqueued, then waits for the last to complete. Every
``sample_every`` seconds it records jobs done, live and dead tuples of ``eddyq_jobs``
(``pg_stat_user_tables``), the table's size with its indexes, how many times autovacuum has run
on it, and the worker's ``VmRSS``.

Completed jobs stay (RETENTION keeps them 24 hours), so the table ends with ``jobs`` rows: what
must stay bounded is the dead tuples left by each job's claim and finish, not the live ones.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.eddyq import Eddyq, setup_django

STATS = """
SELECT n_live_tup, n_dead_tup, autovacuum_count, pg_total_relation_size(relid)
FROM pg_stat_user_tables WHERE relname = 'eddyq_jobs'
"""


def soak(config: dict[str, Any]) -> dict[str, Any]:
    setup_django()
    queue = Eddyq(os.environ["DATABASE_URL"], dict(os.environ))
    queue.setup()
    queue.reset()
    jobs, chunk = config["jobs"], config["chunk"]
    backlog = config.get("backlog", 2 * chunk)
    every = config.get("sample_every", 5.0)
    log = Path(config["log_dir"]) / f"soak-worker-{time.time():.0f}.log"
    concurrency = config.get("concurrency", 10)
    worker = common.WorkerProcess(
        queue.worker_argv("serve", {"concurrency": concurrency}), queue.env, log
    )
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    next_sample = started
    enqueued = 0

    def sample() -> None:
        live, dead, autovacuums, size = queue.connection.execute(STATS).fetchone()
        rss = common.rss_kib(worker.pid)
        samples.append(
            {
                "t": time.monotonic() - started,
                "enqueued": enqueued,
                "done": enqueued - queue.pending(),
                "live": live,
                "dead": dead,
                "autovacuums": autovacuums,
                "size_mib": size / 2**20,
                "rss_mib": (rss or 0) / 1024,
            }
        )

    from benchmarks.noop import noop

    try:
        while enqueued < jobs or queue.pending():
            if not worker.alive():
                raise RuntimeError(f"worker died: {worker.tail()}")
            now = time.monotonic()
            if now >= next_sample:
                sample()
                next_sample = now + every
            waiting = queue.scalar("SELECT count(*) FROM eddyq_jobs WHERE state = 'available'")
            if enqueued < jobs and waiting < backlog:
                size = min(chunk, jobs - enqueued)
                noop.enqueue_many([()] * size)
                enqueued += size
            else:
                time.sleep(0.2)
        seconds = time.monotonic() - started
        time.sleep(1.0)  # the statistics collector lags a little
        sample()
    finally:
        worker.stop()
    completed = queue.completed()
    reloptions = queue.scalar("SELECT reloptions FROM pg_class WHERE oid = 'eddyq_jobs'::regclass")
    queue.close()
    warm = [s for s in samples if s["done"] >= min(jobs // 20, 50_000)] or samples
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "completed": completed,
        "reloptions": reloptions,
        "chunk": chunk,
        "backlog": backlog,
        "seconds": seconds,
        "rate": jobs / seconds,
        "samples": samples,
        "max_dead_tuples": max(s["dead"] for s in samples),
        "last_dead_tuples": samples[-1]["dead"],
        "autovacuums": samples[-1]["autovacuums"],
        "rss_first_mib": warm[0]["rss_mib"],
        "rss_last_mib": [s for s in samples if s["rss_mib"]][-1]["rss_mib"],
        "rss_max_mib": max(s["rss_mib"] for s in samples),
    }


if __name__ == "__main__":
    common.subject_main({"soak": soak})
