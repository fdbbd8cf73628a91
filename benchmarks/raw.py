"""The limit: what plain psycopg gets out of the same server with a minimal queue table.

No library, no Django, no handler: one process, one connection, prepared statements.

* insert: ``INSERT ... RETURNING id`` of one job per statement, in autocommit (one transaction,
  one WAL flush each) — the ceiling of a single enqueue. Measured by benchmarks/eddyq.py with
  this table and statement, interleaved with ``task.enqueue()``.
* copy: ``COPY raw_jobs (task, args) FROM STDIN`` in chunks, each its own transaction — the
  ceiling of a bulk enqueue.
* claim + complete at batch 1 and batch 100: the loop every SKIP LOCKED queue runs, stripped to
  two statements — claim a batch (``FOR UPDATE SKIP LOCKED`` off the partial index, mark it
  running, commit), then mark it completed (commit). Two transactions per batch, as a queue
  needs: the claim must be durable before the work starts, the completion once it has ended.
* latency: the floor of LISTEN/NOTIFY — each job inserted with a ``pg_notify`` in the same
  statement; a process of its own LISTENs, and on each notification claims (batch 10) and
  records when it holds the job, as a handler would start.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks import common, harness
from benchmarks.harness import guarded

SCHEMA = """
CREATE TABLE IF NOT EXISTS raw_jobs (
    id bigserial PRIMARY KEY,
    task text NOT NULL,
    args jsonb NOT NULL DEFAULT '[]',
    queue text NOT NULL DEFAULT 'default',
    priority smallint NOT NULL DEFAULT 0,
    state text NOT NULL DEFAULT 'available',
    attempt integer NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    locked_by text,
    locked_until timestamptz,
    finalized_at timestamptz
);
CREATE INDEX IF NOT EXISTS raw_jobs_claim_idx
    ON raw_jobs (priority DESC, run_at, id) WHERE state = 'available';
"""

INSERT = "INSERT INTO raw_jobs (task, args) VALUES (%s, %s) RETURNING id"

CLAIM = """
UPDATE raw_jobs AS job
SET state = 'running', attempt = job.attempt + 1, locked_by = %(worker)s,
    locked_until = now() + interval '60 seconds'
FROM (
    SELECT id FROM raw_jobs
    WHERE state = 'available'
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS picked
WHERE job.id = picked.id
RETURNING job.id, job.task, job.args
"""

COMPLETE = """
UPDATE raw_jobs
SET state = 'completed', finalized_at = now(), locked_by = NULL, locked_until = NULL
WHERE id = ANY(%(ids)s) AND state = 'running' AND locked_by = %(worker)s
"""

TASK = "benchmarks.noop.noop"
CHANNEL = "raw_jobs"

INSERT_NOTIFY = f"""
WITH job AS (INSERT INTO raw_jobs (task, args) VALUES (%s, %s) RETURNING id)
SELECT id, pg_notify('{CHANNEL}', '') FROM job
"""


def connect() -> psycopg.Connection[Any]:
    return psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, prepare_threshold=0)


def setup(config: dict[str, Any]) -> dict[str, Any]:
    with connect() as connection:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                connection.execute(statement, prepare=False)
    return {"ok": True}


def reset(connection: psycopg.Connection[Any]) -> None:
    connection.execute("TRUNCATE raw_jobs")


def copy(connection: psycopg.Connection[Any], n: int, chunk: int) -> float:
    reset(connection)
    with common.timed() as elapsed:
        for start in range(0, n, chunk):
            with (
                connection.transaction(),
                connection.cursor() as cursor,
                cursor.copy("COPY raw_jobs (task, args) FROM STDIN") as stream,
            ):
                for _ in range(min(chunk, n - start)):
                    stream.write_row((TASK, "[]"))
    return n / elapsed[0]


def fill(connection: psycopg.Connection[Any], n: int) -> None:
    reset(connection)
    with (
        connection.cursor() as cursor,
        cursor.copy("COPY raw_jobs (task, args) FROM STDIN") as stream,
    ):
        for _ in range(n):
            stream.write_row((TASK, "[]"))
    connection.execute("VACUUM ANALYZE raw_jobs")


def claim_complete(connection: psycopg.Connection[Any], n: int, batch: int) -> float:
    fill(connection, n)
    params = {"worker": f"raw:{os.getpid()}", "limit": batch}
    done = 0
    with common.timed() as elapsed:
        while True:
            rows = connection.execute(CLAIM, params).fetchall()
            if not rows:
                break
            connection.execute(COMPLETE, {"ids": [row[0] for row in rows], **params})
            done += len(rows)
    if done != n:
        raise RuntimeError(f"claimed {done} of {n}")
    return n / elapsed[0]


class RawListener(harness.Subject):
    """The raw loop as a subject of the latency scenario."""

    name = "raw"

    def reset(self) -> None:
        reset(self.connection)

    def enqueue_probe(self, key: int) -> None:
        self.connection.execute(INSERT_NOTIFY, (TASK, Jsonb([key])), prepare=True).fetchall()

    def worker_argv(self, mode: str, options: dict[str, Any]) -> list[str]:
        return [sys.executable, "-m", "benchmarks.raw", "listen", "{}"]


def listen(config: dict[str, Any]) -> dict[str, Any]:
    """LISTEN; on each notification claim and complete until nothing is left."""
    params = {"worker": f"raw:{os.getpid()}", "limit": 10}
    with connect() as connection, connect() as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        while True:
            while rows := connection.execute(CLAIM, params).fetchall():
                for row in rows:
                    common.record_start(row[2][0])
                connection.execute(COMPLETE, {"ids": [row[0] for row in rows], **params})
            for _ in listener.notifies(timeout=1.0, stop_after=1):
                pass


def run_round(config: dict[str, Any]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    wanted = set(config.get("scenarios") or ["single", "many", "drain", "latency"])
    with connect() as connection:
        if "many" in wanted:
            guarded(results, "copy", copy, connection, config["many"], config["chunk"])
        if "drain" in wanted:
            for batch in (1, 100):
                guarded(
                    results,
                    f"claim_batch{batch}",
                    claim_complete,
                    connection,
                    config["drain"],
                    batch,
                )
        reset(connection)
    if "latency" in wanted:
        subject = RawListener(os.environ["DATABASE_URL"], dict(os.environ))
        guarded(
            results,
            "latency",
            harness.latency,
            subject,
            config["latency"],
            config["interval"],
            log_dir=Path(config["log_dir"]),
            timeout=config.get("timeout", 600),
        )
        subject.close()
    return results


if __name__ == "__main__":
    common.subject_main({"setup": setup, "round": run_round, "listen": listen})
