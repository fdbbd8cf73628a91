"""How long a Prometheus scrape's database read takes at a million retained rows.

    python benchmarks/metrics_scrape.py [--rows 1000000] [--scrapes 30] [--explain]

Runs against ``DATABASE_URL`` (or the demo's embedded PostgreSQL), in a database of its own,
``eddyq_bench_run_metrics``, dropped and created afresh, so that it never touches your jobs. It
fills ``eddyq_jobs`` with ``--rows`` jobs in the shape of a busy queue that keeps its history
(INSERT ... SELECT from generate_series, then VACUUM ANALYZE, as ``benchmarks/eddyq.py``'s
retained mode): 90 % completed, 3 % failed, 1 % cancelled, 5 % available (a backlog over three
queues and three priorities, the oldest an hour old), 0.5 % scheduled, some retryable and
running, across three queues and seven tasks. Then it reads the gauges ``--scrapes`` times, as
a scrape does (``django_eddyq.metrics.read_gauges``: its own connection, one statement under a
``statement_timeout``), and prints the median, the 95th percentile and the slowest, with the
statement alone (connection set up beforehand) beside it. ``--explain`` prints the statement's
``EXPLAIN (ANALYZE, BUFFERS)``.

docs/performance.md gives the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # python benchmarks/metrics_scrape.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

DATABASE = common.bench_database("metrics")

# Each row i of generate_series(first, last) becomes a job; its share of the table decides its
# state (by i modulo 1000), its queue and task (by other moduli), and its times.
LOAD = """
INSERT INTO eddyq_jobs (
    task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
    attempted_at, finalized_at, locked_by, locked_until, errors, metadata
)
SELECT 'bench.task' || (i %% 7), '[]'::jsonb, '{}'::jsonb,
       (ARRAY['default', 'default', 'default', 'emails', 'reports'])[1 + i %% 5],
       CASE WHEN state = 'available' THEN (ARRAY[0, 5, -5])[1 + i %% 3] ELSE 0 END,
       state, CASE WHEN state IN ('available', 'scheduled') THEN 0 ELSE 1 END, 25,
       CASE WHEN state = 'scheduled' THEN now() + make_interval(secs => 60 + i %% 86400)
            WHEN state = 'available' THEN now() - make_interval(secs => (i * 7) %% 3600)
            ELSE now() - make_interval(secs => 43200 - i * 0.04) END,
       now() - make_interval(secs => 43200 - i * 0.04),
       CASE WHEN state NOT IN ('available', 'scheduled') THEN now() END,
       CASE WHEN state IN ('completed', 'failed', 'cancelled')
            THEN now() - make_interval(secs => 43200 - i * 0.04) END,
       CASE WHEN state = 'running' THEN 'bench:1:abc' END,
       CASE WHEN state = 'running' THEN now() + interval '1 minute' END,
       '[]'::jsonb, '{}'::jsonb
FROM (
    SELECT i, CASE WHEN i %% 1000 < 900 THEN 'completed'
                   WHEN i %% 1000 < 930 THEN 'failed'
                   WHEN i %% 1000 < 940 THEN 'cancelled'
                   WHEN i %% 1000 < 990 THEN 'available'
                   WHEN i %% 1000 < 995 THEN 'scheduled'
                   WHEN i %% 1000 < 999 THEN 'retryable'
                   WHEN i %% 4000 = 999 THEN 'running'
                   ELSE 'completed' END AS state
    FROM generate_series(%(first)s, %(last)s) AS i
) AS generated
"""

QUEUES = """
INSERT INTO eddyq_queues (name, created_at, updated_at, metadata)
VALUES ('default', now(), now(), '{}'), ('emails', now(), now(), '{}'),
       ('reports', now(), now(), '{}'), ('idle', now(), now(), '{}')
ON CONFLICT (name) DO NOTHING
"""


def setup(server_url: str) -> str:
    url = common.recreate_database(server_url, DATABASE)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ["DJANGO_DEBUG"] = "False"
    sys.path[:0] = [str(common.REPO), str(common.REPO / "testproject")]
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return url


def load(url: str, rows: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        for first in range(0, rows, 100_000):
            connection.execute(LOAD, {"first": first, "last": min(first + 100_000, rows) - 1})
        connection.execute(QUEUES)
        connection.execute("VACUUM ANALYZE eddyq_jobs")
        counts = connection.execute(
            "SELECT state, count(*) FROM eddyq_jobs GROUP BY state ORDER BY state"
        ).fetchall()
    print("loaded: " + ", ".join(f"{state} {count:,}" for state, count in counts))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--scrapes", type=int, default=30)
    parser.add_argument("--explain", action="store_true")
    options = parser.parse_args()
    sys.path[:0] = [str(common.REPO / "testproject")]
    from testproject.databases import database_url

    url = setup(database_url())
    started = time.perf_counter()
    load(url, options.rows)
    print(f"filled {options.rows:,} rows in {time.perf_counter() - started:.0f} s")

    import psycopg

    from django_eddyq import metrics, sql

    reads: list[float] = []
    gauges: Any = None
    for _ in range(options.scrapes):
        started = time.perf_counter()
        gauges = metrics.read_gauges()
        reads.append((time.perf_counter() - started) * 1000)
    statements: list[float] = []
    with psycopg.connect(url, autocommit=True) as connection:
        settings = {"statement_timeout": "2s"}
        for _ in range(options.scrapes):
            with connection.transaction():
                connection.execute(sql.METRICS_READ_SETTINGS, settings)
                started = time.perf_counter()
                connection.execute(sql.METRICS_GAUGES, metrics.gauge_parameters()).fetchall()
                statements.append((time.perf_counter() - started) * 1000)
        if options.explain:
            with connection.transaction():
                connection.execute(sql.METRICS_READ_SETTINGS, settings)
                plan = connection.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql.METRICS_GAUGES,
                    metrics.gauge_parameters(),
                ).fetchall()
            print("\n".join(line for (line,) in plan))
    if gauges is None or not gauges.ok:
        raise SystemExit(f"the gauges could not be read: {gauges}")
    for (queue, state), value in sorted(gauges.jobs.items()):
        print(f"  eddyq_jobs{{queue={queue!r}, state={state!r}}} {value:,.0f}")
    for queue, age in sorted(gauges.latency.items()):
        print(f"  eddyq_queue_latency_seconds{{queue={queue!r}}} {age:,.1f}")
    for label, values in [("scrape (connect + read)", reads), ("statement alone", statements)]:
        print(
            f"{label}: median {statistics.median(values):.1f} ms, p95 "
            f"{percentile(values, 0.95):.1f} ms, max {max(values):.1f} ms "
            f"({options.scrapes} scrapes, {options.rows:,} rows)"
        )


if __name__ == "__main__":
    main()
