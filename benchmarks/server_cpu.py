"""What a job costs the PostgreSQL server: its CPU per job, as more worker processes drain.

    python benchmarks/server_cpu.py [--jobs 20000] [--processes 1,2,4,8] [--runs 3]

Runs against ``DATABASE_URL``'s server, which must run on this machine (its processes' CPU is
read from ``/proc``), in ``drain.py``'s database (``eddyq_bench``, or ``BENCH_DATABASE``'s name).
For each number of processes, ``--runs`` times (the numbers alternated): ``--jobs`` no-op jobs
enqueued beforehand, then ``eddyq_worker --burst --processes P --concurrency 10`` drains them.
Meanwhile a monitor polls, every 20 ms, the server processes of that database (their pids from
``pg_stat_activity``) and reads each one's CPU time (``utime + stime`` of ``/proc/<pid>/stat``),
keeping the last reading of each: their sum is the CPU the server spent in the backends serving
the drain. Not counted: the WAL writer, the checkpointer and autovacuum, which serve every
database of the server at once (on a shared server, they also serve others). Also printed: the
WAL the server wrote per job (``pg_current_wal_lsn()`` before and after: the whole server's, so
an upper bound on a shared one), the worker processes' own CPU (their rusage), jobs per second
from spawn to the last completion, and how many of the monitor's samples found a backend waiting
on a lock (claim contention).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # python benchmarks/server_cpu.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.drain import MANAGE, setup_django

TICKS = os.sysconf("SC_CLK_TCK")
POLL_SECONDS = 0.02


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, in seconds; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command: state is field 3, utime field 14 and stime field 15 of stat(5).
    return (int(fields[11]) + int(fields[12])) / TICKS


class Monitor(threading.Thread):
    """Polls the backends of one database until stopped: the CPU each used since it was first
    seen (or since it started, for one that started during the drain), and lock waits."""

    def __init__(self, url: str, database: str) -> None:
        super().__init__(daemon=True)
        import psycopg

        self._connection = psycopg.connect(url, autocommit=True)
        self._database = database
        self._own = self._connection.info.backend_pid
        self._stopping = threading.Event()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.lock_waits = 0

    def backends(self) -> list[tuple[int, bool]]:
        rows = self._connection.execute(
            "SELECT pid, wait_event_type = 'Lock' FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> %s",
            [self._database, self._own],
        ).fetchall()
        return [(pid, bool(waiting)) for pid, waiting in rows]

    def baseline(self) -> None:
        """The backends already there (the benchmark's own connection) count from now."""
        for pid, _waiting in self.backends():
            if (seconds := cpu_seconds(pid)) is not None:
                self.first[pid] = seconds

    def run(self) -> None:
        while not self._stopping.is_set():
            for pid, waiting in self.backends():
                self.lock_waits += waiting
                if (seconds := cpu_seconds(pid)) is not None:
                    self.first.setdefault(pid, 0.0)
                    self.last[pid] = seconds
            time.sleep(POLL_SECONDS)

    def stop(self) -> float:
        """Stop polling; the backends' CPU seconds in all."""
        self._stopping.set()
        self.join()
        self._connection.close()
        return sum(seconds - self.first[pid] for pid, seconds in self.last.items())


def drain(jobs: int, processes: int) -> dict[str, float]:
    from django.db import connection

    from benchmarks.noop import noop

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE eddyq_jobs")
    for start in range(0, jobs, 10_000):
        noop.enqueue_many([() for _ in range(min(10_000, jobs - start))])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE eddyq_jobs")
    settings = connection.settings_dict
    url = (
        f"postgresql://{settings['USER']}:{settings['PASSWORD']}@{settings['HOST']}:"
        f"{settings['PORT']}/{settings['NAME']}"
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()")
        wal_before = cursor.fetchone()[0]
    monitor = Monitor(url, settings["NAME"])
    monitor.baseline()
    monitor.start()
    before = os.times()
    started = time.time()
    argv = [sys.executable, str(MANAGE), "eddyq_worker", "--burst", "--concurrency", "10"]
    if processes > 1:
        argv += ["--processes", str(processes)]
    subprocess.run(
        argv,
        check=True,
        env={**os.environ, "DJANGO_LOG_LEVEL": "WARNING", "DJANGO_DEBUG": "False"},
        stdout=subprocess.DEVNULL,
    )
    after = os.times()
    server = monitor.stop()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE state <> 'completed'), extract(epoch FROM"
            " max(finalized_at)) FROM eddyq_jobs"
        )
        left, last = cursor.fetchone()
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [wal_before])
        wal = float(cursor.fetchone()[0])
    if left:
        raise SystemExit(f"{left} jobs were not completed")
    worker = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return {
        "rate": jobs / (float(last) - started),
        "server_us": server / jobs * 1e6,
        "worker_us": worker / jobs * 1e6,
        "lock_waits": monitor.lock_waits,
        "wal_bytes": wal / jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--processes", default="1,2,4,8")
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    setup_django()
    counts = [int(value) for value in options.processes.split(",")]
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    results: dict[int, list[dict[str, Any]]] = {count: [] for count in counts}
    for _ in range(options.runs):
        for count in counts:
            results[count].append(drain(options.jobs, count))
    print(f"load average after:  {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(
        f"\n{options.jobs:,} no-op jobs, eddyq_worker --burst --concurrency 10, median of "
        f"{options.runs} (spawn → last completion; CPU per job: the server's backends of this "
        "database, the worker processes)"
    )
    print(
        f"  {'processes':>9} {'jobs/s':>9} {'server µs/job':>14} {'worker µs/job':>14}"
        f" {'WAL bytes/job':>14}"
    )
    for count, runs in results.items():
        print(
            f"  {count:>9} {statistics.median(r['rate'] for r in runs):>9,.0f}"
            f" {statistics.median(r['server_us'] for r in runs):>14,.0f}"
            f" {statistics.median(r['worker_us'] for r in runs):>14,.0f}"
            f" {statistics.median(r['wal_bytes'] for r in runs):>14,.0f}"
        )
    waits = "; ".join(f"{c}: {[r['lock_waits'] for r in runs]}" for c, runs in results.items())
    print(f"  ({os.cpu_count()} CPUs; samples of a backend waiting on a lock, by run: {waits})")


if __name__ == "__main__":
    main()
