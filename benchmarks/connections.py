"""What Django's connection settings cost an enqueue in a request and a worker's jobs.

    python benchmarks/connections.py [--requests 2000] [--jobs 5000] [--runs 3]

Runs against ``DATABASE_URL`` (or the demo's embedded PostgreSQL), in ``drain.py``'s database
(``eddyq_bench``, or ``BENCH_DATABASE``'s name). Two parts, each alternating its rows:

* **Enqueue in a request.** ``noop.enqueue()`` once per request, each request its own
  transaction: ``request_started``, the enqueue, ``request_finished``, the two signals on which
  Django closes a connection older than its ``CONN_MAX_AGE``. With Django's default
  (``CONN_MAX_AGE`` 0) each request opens a connection; with ``CONN_MAX_AGE`` 600 it is kept,
  with ``CONN_HEALTH_CHECKS`` checked once a request; with ``OPTIONS={"pool": True}`` it is
  borrowed from psycopg's pool. Against them: the same calls with no request around them (a
  script's loop), and a raw psycopg ``INSERT`` of the same row on one connection, prepared.
* **A worker's jobs that query.** ``eddyq_worker --burst --concurrency 10`` drains ``--jobs``
  jobs of ``benchmarks.noop.query`` (one ``SELECT 1`` on Django's connection, as a handler that
  reads a row does), with the worker's ``CONN_MAX_AGE`` at 0 and at 600: the worker closes
  connections older than that around each job, as a request does. Jobs per second from the first
  claim to the last completion, and from spawn to the last completion.

Prints the median of ``--runs`` runs of each row (blocks of ``--requests / 10`` calls).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

if __package__ in (None, ""):  # python benchmarks/connections.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.drain import MANAGE, setup_django

# The settings of each row's connection, on top of the test project's.
REQUEST_ROWS: dict[str, dict[str, object]] = {
    "CONN_MAX_AGE 0 (Django's default): a connection per request": {"CONN_MAX_AGE": 0},
    "CONN_MAX_AGE 600": {"CONN_MAX_AGE": 600},
    "CONN_MAX_AGE 600, CONN_HEALTH_CHECKS": {"CONN_MAX_AGE": 600, "CONN_HEALTH_CHECKS": True},
    'OPTIONS {"pool": True} (psycopg_pool)': {"CONN_MAX_AGE": 0, "OPTIONS": {"pool": True}},
}
NO_REQUEST = "no request around it (a script's loop), CONN_MAX_AGE 0"
RAW_INSERT = "raw psycopg INSERT … RETURNING id of the same row, one connection"
WORKER_ROWS = {"CONN_MAX_AGE 0 (Django's default)": "", "CONN_MAX_AGE 600": "conn_max_age=600"}


def add_databases() -> list[str]:
    """One alias per request row, each a copy of ``default`` (which has no OPTIONS of its own)
    with the row's settings."""
    from django.conf import settings

    default = settings.DATABASES["default"]
    aliases = []
    for number, overrides in enumerate(REQUEST_ROWS.values()):
        alias = f"bench_{number}"
        settings.DATABASES[alias] = {**default, **overrides}
        aliases.append(alias)
    return aliases


def enqueue_in_requests(alias: str, count: int, *, requests: bool = True) -> None:
    from django.core.signals import request_finished, request_started
    from django.test import override_settings

    from benchmarks.noop import noop

    with override_settings(EDDYQ={"DATABASE": alias}):
        for _ in range(count):
            if requests:
                request_started.send(sender=None)
            noop.enqueue()
            if requests:
                request_finished.send(sender=None)


def raw_inserts(url: str) -> Callable[[int], None]:
    import psycopg
    from psycopg.types.json import Jsonb

    from benchmarks.eddyq import NOOP, RAW_INSERT_JOB

    connection = psycopg.connect(url, autocommit=True, prepare_threshold=0)
    empty_list, empty_dict = Jsonb([]), Jsonb({})

    def insert(count: int) -> None:
        for _ in range(count):
            connection.execute(RAW_INSERT_JOB, (NOOP, empty_list, empty_dict)).fetchone()

    return insert


def request_part(requests: int, runs: int) -> None:
    from django.conf import settings
    from django.db import connections

    from benchmarks.eddyq import _interleaved

    aliases = add_databases()
    # Each settings change of override_settings reloads the queue's settings; the rows differ
    # only in the connection they enqueue on.
    methods: dict[str, Callable[[int], None]] = {
        label: (lambda count, alias=alias: enqueue_in_requests(alias, count))
        for label, alias in zip(REQUEST_ROWS, aliases, strict=True)
    }
    methods[NO_REQUEST] = lambda count: enqueue_in_requests("default", count, requests=False)
    database = settings.DATABASES["default"]
    methods[RAW_INSERT] = raw_inserts(
        f"postgresql://{database['USER']}:{database['PASSWORD']}@{database['HOST']}:"
        f"{database['PORT']}/{database['NAME']}"
    )
    rates: dict[str, list[float]] = {label: [] for label in methods}
    for _ in range(runs):
        for label, rate in _interleaved(methods, requests, 10).items():
            rates[label].append(rate)
        connections["default"].cursor().execute("TRUNCATE eddyq_jobs")
    reference = statistics.median(rates[NO_REQUEST])
    raw = statistics.median(rates[RAW_INSERT])
    print(
        f"\nEnqueue, one job per request, {requests:,} requests a run, median of {runs} "
        "[calls/s; x = ratio to the raw insert]"
    )
    for label, values in rates.items():
        median = statistics.median(values)
        print(f"  {label:64} {median:8,.0f} /s  x{median / raw:.2f}")
    print(f"  (no request around the enqueue: {reference:,.0f} /s)")


def worker_part(jobs: int, runs: int) -> None:
    from django.db import connection

    from benchmarks.noop import query

    url = urlsplit(os.environ["DATABASE_URL"])
    results: dict[str, list[tuple[float, float]]] = {label: [] for label in WORKER_ROWS}
    for _ in range(runs):
        for label, options in WORKER_ROWS.items():
            with connection.cursor() as cursor:
                cursor.execute("TRUNCATE eddyq_jobs")
            for start in range(0, jobs, 10_000):
                query.enqueue_many([() for _ in range(min(10_000, jobs - start))])
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE eddyq_jobs")
            started = time.time()
            subprocess.run(
                [sys.executable, str(MANAGE), "eddyq_worker", "--burst", "-v", "0"],
                check=True,
                env={
                    **os.environ,
                    "DATABASE_URL": urlunsplit(url._replace(query=options)),
                    "DJANGO_LOG_LEVEL": "WARNING",
                    "DJANGO_DEBUG": "False",
                    "EDDYQ_TASK_MODULES": "benchmarks.noop",
                },
                stdout=subprocess.DEVNULL,
            )
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FILTER (WHERE state <> 'completed'),"
                    " extract(epoch FROM min(attempted_at)), extract(epoch FROM max(finalized_at))"
                    " FROM eddyq_jobs"
                )
                left, first_claim, last = cursor.fetchone()
            if left:
                raise SystemExit(f"{left} jobs were not completed")
            steady = jobs / (float(last) - float(first_claim))
            results[label].append((steady, jobs / (float(last) - started)))
    print(
        f"\nA worker's jobs that query (one SELECT 1 each), {jobs:,} jobs, --concurrency 10, "
        f"median of {runs} [jobs/s]"
    )
    print(f"  {'':40} {'first claim → last':>20} {'spawn → last':>14}")
    for label, values in results.items():
        steady = statistics.median(v[0] for v in values)
        overall = statistics.median(v[1] for v in values)
        print(f"  {label:40} {steady:20,.0f} {overall:14,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-worker", action="store_true", help="the request part alone")
    options = parser.parse_args()
    setup_django()
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    request_part(options.requests, options.runs)
    if not options.skip_worker:
        worker_part(options.jobs, options.runs)
    print(f"load average after:  {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
