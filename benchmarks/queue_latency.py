"""How fast ``inspection.queue_latencies`` (``sql.QUEUE_LATENCY``) answers with a million
available jobs: what ``eddyq_health --max-latency`` and the latency gauge send.

    python benchmarks/queue_latency.py [--jobs 1000000] [--runs 20] [--rebuild]

Runs against ``DATABASE_URL`` (or the demo's embedded PostgreSQL), in a database of its own
(``eddyq_bench_latency``) so that it never touches your jobs. The first run fills it with
``--jobs`` available jobs spread over five queues (one of them rare) and four priorities, due
over the last hour; later runs reuse them. Then it prints the median and slowest time of
``--runs`` reads (after one to warm up), the buffers one read touches, and for comparison the
time of the plain ``GROUP BY`` that reads every available job.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
BENCH_DATABASE = "eddyq_bench_latency"
CHUNK = 100_000

# One available job per i of generate_series(%(start)s, %(stop)s): half in default, a quarter in
# emails, then reports, webhooks and a rare queue (0.1 %); priorities 0 (most), 10, -10 and 100;
# due at some time in the last hour.
FILL = """
INSERT INTO eddyq_jobs (
    task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
    errors, metadata
)
SELECT 'app.tasks.task_' || lpad((i %% 30)::text, 2, '0'),
       jsonb_build_array(i),
       '{}'::jsonb,
       CASE WHEN i %% 1000 = 0 THEN 'rare'
            WHEN i %% 20 < 10 THEN 'default'
            WHEN i %% 20 < 15 THEN 'emails'
            WHEN i %% 20 < 18 THEN 'reports'
            ELSE 'webhooks' END,
       CASE WHEN (i / 7) %% 10 < 7 THEN 0 WHEN (i / 7) %% 10 < 9 THEN 10
            WHEN (i / 7) %% 100 < 99 THEN -10 ELSE 100 END,
       'available',
       0,
       25,
       now() - make_interval(secs => ((i::bigint * 7919) %% 3600)),
       now() - interval '1 hour',
       '[]'::jsonb,
       '{}'::jsonb
FROM generate_series(%(start)s, %(stop)s) AS i
"""

# What the skip scan saves: every available job read, and grouped.
GROUP_BY = """
SELECT queue, (extract(epoch FROM now()) - extract(epoch FROM min(run_at)))::float8
FROM eddyq_jobs
WHERE state = 'available' AND run_at <= now()
GROUP BY queue
ORDER BY queue
"""


def setup_django() -> None:
    sys.path[:0] = [str(REPO), str(REPO / "testproject")]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("DJANGO_DEBUG", "false")
    from testproject.databases import database_url

    server_url = urlsplit(database_url())
    create_database(urlunsplit(server_url._replace(path="/postgres")))
    os.environ["DATABASE_URL"] = urlunsplit(server_url._replace(path=f"/{BENCH_DATABASE}"))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def create_database(maintenance_url: str) -> None:
    import psycopg

    with psycopg.connect(maintenance_url, autocommit=True) as connection:
        exists = connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DATABASE]
        ).fetchone()
        if not exists:
            connection.execute(f"CREATE DATABASE {BENCH_DATABASE}")


def available_jobs() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM eddyq_jobs WHERE state = 'available'")
        (count,) = cursor.fetchone()
    return int(count)


def fill(jobs: int) -> None:
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE eddyq_jobs")
        for start in range(1, jobs + 1, CHUNK):
            stop = min(start + CHUNK - 1, jobs)
            cursor.execute(FILL, {"start": start, "stop": stop})
            print(f"  {stop:,} jobs", end="\r", flush=True)
        cursor.execute("VACUUM ANALYZE eddyq_jobs")
    print(f"\nfilled {jobs:,} available jobs in {time.perf_counter() - started:.0f} s")


def timed(read: object, runs: int) -> list[float]:
    assert callable(read)
    read()  # warm-up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        read()
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rebuild", action="store_true", help="Fill the table again.")
    options = parser.parse_args()
    setup_django()
    from django.db import connection

    from django_eddyq import inspection, sql

    if options.rebuild or available_jobs() != options.jobs:
        fill(options.jobs)
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        (version,) = cursor.fetchone()
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql.QUEUE_LATENCY}")
        plan = cursor.fetchone()[0][0]
    buffers = plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0)

    def group_by() -> None:
        with connection.cursor() as cursor:
            cursor.execute(GROUP_BY)
            cursor.fetchall()

    latencies = inspection.queue_latencies()
    assert latencies.keys() == {"default", "emails", "reports", "rare", "webhooks"}, latencies
    skip_scan = timed(inspection.queue_latencies, options.runs)
    plain = timed(group_by, max(1, options.runs // 5))
    print(version.split(",")[0])
    print(f"{options.jobs:,} available jobs, 5 queues, 4 priorities; {options.runs} runs")
    print(f"{'read':40} {'median ms':>10} {'slowest ms':>11}")
    for name, times in (
        (f"queue_latencies (skip scan, {buffers} buffers)", skip_scan),
        ("GROUP BY over every available job", plain),
    ):
        print(f"{name:40} {statistics.median(times):10.2f} {max(times):11.2f}")
    for queue, seconds in sorted(latencies.items()):
        print(f"  {queue}: oldest due job waited {seconds:.0f} s")


if __name__ == "__main__":
    main()
