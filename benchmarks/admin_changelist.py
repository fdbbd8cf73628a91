"""How fast the admin's job list answers with a million jobs in the table.

    python benchmarks/admin_changelist.py [--jobs 1000000] [--runs 5] [--rebuild]

Runs against ``DATABASE_URL`` (or the demo's embedded PostgreSQL), in a database of its own
(``eddyq_bench_admin``) so that it never touches your jobs. The first run fills it with
``--jobs`` jobs shaped like a busy queue's (mostly completed, some failed with tracebacks, a few
percent unfinished, a rare queue, jobs past their retention not yet cleaned), in one minute or
so; later runs reuse them while they are fresh enough. Then it requests each page of the admin
as a logged-in superuser through Django's test client, and prints per page the median and
slowest time of ``--runs`` requests (after one to warm up) and the number of SQL queries.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
BENCH_DATABASE = "eddyq_bench_admin"
CHUNK = 100_000
QUEUES = ["default"] * 4 + ["emails"] * 2 + ["reports", "webhooks"]

# One row per job, from generate_series(%(start)s, %(stop)s) AS i. r: a fraction in [0, 1) that
# picks the state; completed jobs finished in the last 12 hours (inside RETENTION's 24 hours),
# failed ones in the last 6 days (inside 7), and 1 % are completed jobs two days old: past
# their retention, hidden but not yet deleted, as between two passes of the cleaner.
FILL = """
INSERT INTO eddyq_jobs (
    task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
    attempted_at, finalized_at, locked_by, locked_until, heartbeat_at, errors, result, metadata
)
SELECT 'app.tasks.task_' || lpad((i %% 30)::text, 2, '0'),
       jsonb_build_array(i, 'user-' || (i %% 10000)),
       jsonb_build_object('attempt_note', 'n' || (i %% 7)),
       CASE WHEN i %% 1000 = 0 THEN 'rare' ELSE (%(queues)s::text[])[1 + i %% 8] END,
       0,
       s.state,
       CASE WHEN s.state IN ('available', 'scheduled') THEN 0 ELSE 1 END,
       25,
       now() - make_interval(secs => r * 43200),
       now() - make_interval(secs => r * 43200 + 5),
       CASE WHEN s.state IN ('available', 'scheduled') THEN NULL
            ELSE now() - make_interval(secs => r * 43200) END,
       CASE WHEN s.state = 'completed' AND r >= 0.01 THEN now() - make_interval(secs => r * 43200)
            WHEN s.state = 'completed' THEN now() - interval '2 days'
            WHEN s.state IN ('failed', 'cancelled') THEN now() - make_interval(secs => r * 518400)
       END,
       CASE WHEN s.state = 'running' THEN 'bench:1:w' END,
       CASE WHEN s.state = 'running' THEN now() + interval '1 hour' END,
       CASE WHEN s.state = 'running' THEN now() END,
       CASE WHEN s.state IN ('failed', 'retryable') THEN jsonb_build_array(jsonb_build_object(
           'attempt', 1, 'at', now(), 'error', 'ConnectionError: upstream timed out',
           'exception_class', 'builtins.ConnectionError',
           'traceback', 'Traceback (most recent call last):'
                        || repeat(E'\\n  File "app/tasks.py", line 42, in call', 12)
                        || E'\\nConnectionError: upstream timed out\\n'))
            ELSE '[]'::jsonb END,
       CASE WHEN s.state = 'completed' THEN jsonb_build_object('ok', true, 'rows', i %% 500) END,
       '{}'::jsonb
FROM generate_series(%(start)s, %(stop)s) AS i,
     LATERAL (SELECT ((i::bigint * 7919) %% 10007) / 10007.0 AS r) AS fraction,
     LATERAL (SELECT CASE
         WHEN r < 0.88 THEN 'completed'
         WHEN r < 0.93 THEN 'failed'
         WHEN r < 0.95 THEN 'cancelled'
         WHEN r < 0.98 THEN 'available'
         WHEN r < 0.99 THEN 'scheduled'
         WHEN r < 0.995 THEN 'retryable'
         ELSE 'running' END AS state) AS s
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


def fresh_enough(jobs: int) -> bool:
    """Whether the table holds ``jobs`` jobs whose completed ones are still visible for a
    while (they were made to finish within 12 hours of the fill, under a 24-hour retention)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM eddyq_jobs")
        (count,) = cursor.fetchone()
        # The leader row was elected at the fill.
        cursor.execute(
            "SELECT bool_and(elected_at > now() - interval '10 hours') FROM eddyq_leader"
        )
        (recent,) = cursor.fetchone()
    return bool(count == jobs and recent)


def fill(jobs: int) -> None:
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE eddyq_jobs, eddyq_queues, eddyq_leader, eddyq_batches")
        for start in range(1, jobs + 1, CHUNK):
            stop = min(start + CHUNK - 1, jobs)
            cursor.execute(FILL, {"start": start, "stop": stop, "queues": QUEUES})
            print(f"  {stop:,} jobs", end="\r", flush=True)
        cursor.execute(
            "INSERT INTO eddyq_queues (name, metadata)"
            " SELECT DISTINCT unnest(%s::text[]), '{}'::jsonb",
            [[*QUEUES, "rare"]],
        )
        cursor.execute("UPDATE eddyq_queues SET paused_at = now() WHERE name = 'reports'")
        cursor.execute(
            "INSERT INTO eddyq_leader (name, leader_id, elected_at, expires_at)"
            " VALUES ('default', 'bench:1:w', now(), now() + interval '100 years')"
        )
    print(f"\rfilled {jobs:,} jobs in {time.perf_counter() - started:.0f} s")
    vacuum()


def vacuum() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE eddyq_jobs")
        cursor.execute("VACUUM ANALYZE eddyq_queues")


def pages() -> list[tuple[str, str]]:
    """(label, URL) of each page timed."""
    from django.db import connection
    from django.urls import reverse

    jobs = reverse("admin:django_eddyq_job_changelist")
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM eddyq_jobs WHERE state = 'failed'")
        (failed_id,) = cursor.fetchone()

    job_page = reverse("admin:django_eddyq_job_change", args=[failed_id])

    def job_list(**params: str) -> str:
        return f"{jobs}?{urlencode(params)}" if params else jobs

    return [
        ("jobs, unfiltered", job_list()),
        ("jobs, page 2", job_list(p="2")),
        ("jobs, page 100", job_list(p="100")),
        ("jobs, state=failed", job_list(state__exact="failed")),
        ("jobs, state=completed", job_list(state__exact="completed")),
        ("jobs, state=running", job_list(state__exact="running")),
        ("jobs, queue=emails", job_list(queue="emails")),
        ("jobs, queue=rare (0.1 %)", job_list(queue="rare")),
        ("jobs, task=app.tasks.task_07", job_list(task="app.tasks.task_07")),
        ("jobs, failed in queue=rare", job_list(state__exact="failed", queue="rare")),
        ("jobs, search by id", job_list(q=str(failed_id))),
        ("jobs, search in args (scans)", job_list(q="user-4242")),
        ("job page (failed, traceback)", job_page),
        ("queues", reverse("admin:django_eddyq_queue_changelist")),
        ("batches", reverse("admin:django_eddyq_batch_changelist")),
    ]


def time_page(client: object, url: str, runs: int) -> tuple[list[float], int]:
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    get = client.get  # type: ignore[attr-defined]
    response = get(url)  # warm-up
    if response.status_code != 200:
        raise SystemExit(f"{url}: HTTP {response.status_code}")
    timings = []
    for _ in range(runs):
        with CaptureQueriesContext(connections["default"]) as queries:
            started = time.perf_counter()
            get(url)
            timings.append((time.perf_counter() - started) * 1000)
    return timings, len(queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rebuild", action="store_true", help="Refill the jobs table.")
    options = parser.parse_args()
    setup_django()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    if options.rebuild or not fresh_enough(options.jobs):
        fill(options.jobs)
    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    version = connection.pg_version  # type: ignore[attr-defined]
    print(f"{options.jobs:,} jobs, PostgreSQL {version // 10000}.{version % 10000}")
    print(f"{'page':<34} {'median ms':>10} {'slowest ms':>11} {'queries':>8}")
    for label, url in pages():
        timings, queries = time_page(client, url, options.runs)
        print(f"{label:<34} {statistics.median(timings):>10.1f} {max(timings):>11.1f} {queries:>8}")


if __name__ == "__main__":
    main()
