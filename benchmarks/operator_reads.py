"""How fast ``manage.py eddyq``'s read subcommands answer with a million jobs in the table.

    python benchmarks/operator_reads.py [--jobs 1000000] [--runs 5] [--rebuild]

Uses the table ``benchmarks/admin_changelist.py`` fills (a database of its own,
``eddyq_bench_admin``, refilled only when stale). Each read subcommand runs in this process through
``call_command``, as ``manage.py`` runs it once Django has started: it prints per subcommand the
median and slowest time of ``--runs`` runs (after one to warm up) and the number of SQL queries.
The target is under a second each.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.admin_changelist import fill, fresh_enough, setup_django

TARGET_MS = 1000.0


def commands() -> list[tuple[str, Sequence[str]]]:
    """(label, arguments of ``manage.py eddyq``) of each read timed."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM eddyq_jobs WHERE state = 'failed'")
        (failed_id,) = cursor.fetchone()
    return [
        ("status", ["status"]),
        ("status --json", ["status", "--json"]),
        ("jobs", ["jobs"]),
        ("jobs --state failed", ["jobs", "--state", "failed"]),
        ("jobs --state running", ["jobs", "--state", "running"]),
        ("jobs --queue rare (0.1 %)", ["jobs", "--queue", "rare"]),
        ("jobs --task task_07", ["jobs", "--task", "app.tasks.task_07"]),
        ("jobs failed, queue rare", ["jobs", "--state", "failed", "--queue", "rare"]),
        ("jobs --since 1h", ["jobs", "--since", "1h"]),
        ("jobs --search ID", ["jobs", "--search", str(failed_id)]),
        ("jobs --search text (scans)", ["jobs", "--search", "task_07"]),
        ("jobs --limit 1000 --json", ["jobs", "--limit", "1000", "--json"]),
        ("job ID (failed, traceback)", ["job", str(failed_id)]),
        ("periodic", ["periodic"]),
        ("retry --state failed --dry-run", ["retry", "--state", "failed", "--dry-run"]),
    ]


def time_command(arguments: Sequence[str], runs: int) -> tuple[list[float], int]:
    from django.core.management import call_command
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    def run() -> None:
        try:
            call_command("eddyq", *arguments, stdout=io.StringIO(), stderr=io.StringIO())
        except SystemExit as exit_status:  # 1: nothing matched, or unhealthy; still an answer
            if exit_status.code not in (0, 1, None):
                raise

    run()  # warm-up
    timings = []
    for _ in range(runs):
        with CaptureQueriesContext(connections["default"]) as queries:
            started = time.perf_counter()
            run()
            timings.append((time.perf_counter() - started) * 1000)
    return timings, len(queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rebuild", action="store_true", help="Refill the jobs table.")
    options = parser.parse_args()
    setup_django()
    from django.db import connection

    if options.rebuild or not fresh_enough(options.jobs):
        fill(options.jobs)
    version = connection.pg_version  # type: ignore[attr-defined]
    print(f"{options.jobs:,} jobs, PostgreSQL {version // 10000}.{version % 10000}")
    print(f"{'manage.py eddyq …':<34} {'median ms':>10} {'slowest ms':>11} {'queries':>8}")
    slow = []
    for label, arguments in commands():
        timings, queries = time_command(arguments, options.runs)
        median = statistics.median(timings)
        print(f"{label:<34} {median:>10.1f} {max(timings):>11.1f} {queries:>8}")
        if max(timings) >= TARGET_MS:
            slow.append(label)
    if slow:
        print(f"over {TARGET_MS:.0f} ms: {', '.join(slow)}")


if __name__ == "__main__":
    main()
