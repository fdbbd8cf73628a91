"""How fast one ``eddyq_worker --burst`` drains pre-enqueued no-op jobs, start-up included.

    python benchmarks/drain.py [--jobs 10000] [--concurrency 10] [--processes 1] [--runs 3]
                               [--instrumented]

Runs against ``DATABASE_URL`` (or the demo's embedded PostgreSQL), in a database of its own
(``eddyq_bench``, or ``BENCH_DATABASE``'s name) so that it never touches your jobs. Prints jobs
per second per run (and how much of it was start-up) and the median. ``--instrumented`` drains
with the observability on (see ``INSTRUMENTED_ARGUMENTS``), as run.py's
``drain_c10_instrumented`` row does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"
BENCH_DATABASE = os.environ.get("BENCH_DATABASE", "eddyq_bench")

# What an instrumented drain's worker gets on top of a plain one's, here and in run.py's
# drain_c10_instrumented row: Prometheus metrics on, served on a free port of this machine
# (--metrics-port turns METRICS on); and OpenTelemetry tracing on, an SDK tracer provider
# recording every attempt's span, through a batch span processor to an exporter that drops
# them (TESTPROJECT_OTEL: testproject/testproject/otel.py).
INSTRUMENTED_ARGUMENTS = ["--metrics-port", "0", "--metrics-address", "127.0.0.1"]
INSTRUMENTED_ENVIRONMENT: dict[str, str] = {"TESTPROJECT_OTEL": "drop"}


def setup_django() -> None:
    sys.path[:0] = [str(REPO), str(REPO / "testproject")]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("EDDYQ_TASK_MODULES", "benchmarks.noop")
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


def drain_once(
    jobs: int,
    worker_arguments: list[str],
    timeout: float | None = None,
    environment: dict[str, str] | None = None,
) -> tuple[float, float, float]:
    """Jobs per second from spawn to exit; seconds from spawn to the first claim; jobs per
    second from the first claim to the last completion (the database's clock, this machine's)."""
    from django.db import connection

    from benchmarks.noop import noop

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE eddyq_jobs")
    for start in range(0, jobs, 10_000):
        noop.enqueue_many([() for _ in range(min(10_000, jobs - start))])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE eddyq_jobs")

    started = time.perf_counter()
    spawned_at = time.time()
    subprocess.run(
        [sys.executable, str(MANAGE), "eddyq_worker", "--burst", *worker_arguments],
        check=True,
        env={**os.environ, "DJANGO_LOGGING_LEVEL": "WARNING", **(environment or {})},
        stdout=subprocess.DEVNULL,
        timeout=timeout,
    )
    elapsed = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE state <> 'completed'),"
            " extract(epoch FROM min(attempted_at)), extract(epoch FROM max(finalized_at))"
            " FROM eddyq_jobs"
        )
        left, first_claim, last_completion = cursor.fetchone()
    if left:
        raise SystemExit(f"{left} jobs were not completed")
    steady = jobs / (float(last_completion) - float(first_claim))
    return jobs / elapsed, float(first_claim) - spawned_at, steady


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--instrumented", action="store_true", help="metrics (and tracing) on in the worker"
    )
    options = parser.parse_args()
    setup_django()
    worker_arguments = ["--concurrency", str(options.concurrency)]
    if options.processes > 1:
        worker_arguments += ["--processes", str(options.processes)]
    environment = None
    if options.instrumented:
        worker_arguments += INSTRUMENTED_ARGUMENTS
        environment = INSTRUMENTED_ENVIRONMENT
    rates = []
    for run in range(1, options.runs + 1):
        rate, start_up, steady = drain_once(options.jobs, worker_arguments, None, environment)
        rates.append(rate)
        print(
            f"run {run}: {options.jobs} jobs drained at {rate:,.0f} jobs/s (start-up to the "
            f"first claim {start_up:.2f} s, then {steady:,.0f} jobs/s)"
        )
    print(f"median: {statistics.median(rates):,.0f} jobs/s ({' '.join(worker_arguments)})")


if __name__ == "__main__":
    main()
