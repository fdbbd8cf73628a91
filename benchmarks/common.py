"""What every benchmark module shares: the server, databases, timing, workers and statistics.

Every subject (django-eddyq, the raw loop, each peer) runs in a process of its own, started by
``run.py`` with ``python -m benchmarks.<module> <command> <json config>``; it prints one JSON
object on its last line of stdout. That keeps each library's imports, settings and event loops
apart, and a peer that crashes costs one row, not the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"
#: Every database the benchmarks create starts with this (BENCH_DATABASE_PREFIX, for runs of
#: several people on one server); no other database is ever touched.
DATABASE_PREFIX = os.environ.get("BENCH_DATABASE_PREFIX", "eddyq_bench_run")


# --------------------------------------------------------------------------------------------------
# Server and databases


def database_url(server_url: str, name: str) -> str:
    """The URL of database ``name`` on the server of ``server_url``."""
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))


def bench_database(subject: str = "") -> str:
    """``eddyq_bench_run`` for django-eddyq, ``eddyq_bench_run_<subject>`` for the others."""
    return f"{DATABASE_PREFIX}_{subject}" if subject else DATABASE_PREFIX


def recreate_database(server_url: str, name: str) -> str:
    """Drop (if it exists) and create one of the benchmark's own databases; return its URL."""
    import psycopg
    from psycopg import sql

    if not name.startswith(DATABASE_PREFIX):
        raise ValueError(f"refusing to recreate {name!r}: not a benchmark database")
    with psycopg.connect(database_url(server_url, "postgres"), autocommit=True) as connection:
        connection.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url(server_url, name)


def server_description(url: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        version = connection.execute("SHOW server_version").fetchone()[0]
        settings = dict(
            connection.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                [
                    [
                        "fsync",
                        "synchronous_commit",
                        "full_page_writes",
                        "wal_sync_method",
                        "shared_buffers",
                        "max_connections",
                    ]
                ],
            ).fetchall()
        )
    return {"version": version, "settings": settings}


# --------------------------------------------------------------------------------------------------
# Subject processes


def subject_environment(url: str, **extra: str) -> dict[str, str]:
    """Environment of a subject process and of the workers it starts."""
    environment = {
        **os.environ,
        "DATABASE_URL": url,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO), str(REPO / "testproject"), os.environ.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep),
        # As in production: no query log in Django's connections, no autoreloaders.
        "DJANGO_DEBUG": "False",
        "DJANGO_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        # Where the benchmarks' tasks are declared, for the workers' registry (which runs
        # only the tasks declared there).
        "EDDYQ_TASK_MODULES": "benchmarks.noop,benchmarks.probe",
        **extra,
    }
    environment.pop("EDDYQ_EMBEDDED_PGDATA", None)
    return environment


def emit(result: dict[str, Any]) -> None:
    """A subject's answer to run.py: one JSON line, last on stdout."""
    sys.stdout.write("\n" + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()


def subject_main(commands: dict[str, Callable[[dict[str, Any]], dict[str, Any]]]) -> None:
    """``python -m benchmarks.<subject> <command> '<json config>'``: run it, emit its result."""
    command, config = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    emit(commands[command](config))


@dataclass
class SubjectRun:
    result: dict[str, Any] | None
    error: str | None
    seconds: float


def run_subject(
    module: str, command: str, config: dict[str, Any], env: dict[str, str], timeout: float
) -> SubjectRun:
    """Run a subject process; its JSON result, or why there is none."""
    started = time.perf_counter()
    argv = [sys.executable, "-m", module, command, json.dumps(config)]
    try:
        completed = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as error:
        tail = error.stderr or b""
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return SubjectRun(
            None, f"timed out after {timeout:.0f}s {last_line(tail)}".strip(), timeout
        )
    seconds = time.perf_counter() - started
    lines = [line for line in completed.stdout.splitlines() if line.strip()]
    if completed.returncode != 0 or not lines:
        return SubjectRun(
            None, last_line(completed.stderr) or f"exit {completed.returncode}", seconds
        )
    try:
        return SubjectRun(json.loads(lines[-1]), None, seconds)
    except json.JSONDecodeError:
        return SubjectRun(None, f"no result: {lines[-1][:200]}", seconds)


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


# --------------------------------------------------------------------------------------------------
# Workers


class WorkerProcess:
    """A worker started as a process of its own; stopped with SIGTERM (then SIGKILL)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log: Path | None = None) -> None:
        self.argv = list(argv)
        self.log_path = log
        self._log = log.open("wb") if log is not None else subprocess.DEVNULL
        self.started_at = time.time()
        self.process = subprocess.Popen(
            self.argv,
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"worker still running after {timeout:.0f}s") from None

    def stop(self, grace: float = 15.0) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        if self._log is not subprocess.DEVNULL:
            self._log.close()

    def tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return last_line(self.log_path.read_text(errors="replace"))


def rss_kib(pid: int) -> int | None:
    """Resident memory of a process (``VmRSS`` of ``/proc/<pid>/status``), in KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def wait_until(
    condition: Callable[[], bool], timeout: float, interval: float = 0.05, what: str = ""
) -> float:
    """Poll ``condition`` until true; the time.time() at which it was seen true."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return time.time()
        if time.monotonic() >= deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what or condition}")
        time.sleep(interval)


# --------------------------------------------------------------------------------------------------
# Latency probes: handlers append "<key> <time.time()>" to a file as the first thing they do


def latency_file() -> Path:
    return Path(os.environ["BENCH_LATENCY_FILE"])


def read_latency_file(path: Path) -> dict[int, float]:
    starts: dict[int, float] = {}
    if not path.exists():
        return starts
    for line in path.read_text().splitlines():
        key, _, at = line.partition(" ")
        with contextlib.suppress(ValueError):
            starts.setdefault(int(key), float(at))
    return starts


# --------------------------------------------------------------------------------------------------
# Statistics


def percentiles(values: Sequence[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": cuts[49], "p95": cuts[94], "p99": cuts[98]}


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    """``with timed() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    box: list[float] = []
    started = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - started)


_latency_fd: int | None = None


def record_start(key: int) -> None:
    """A probe handler's first act: append ``<key> <time.time()>`` to BENCH_LATENCY_FILE.

    One ``write`` of one line on an ``O_APPEND`` descriptor: lines from concurrent handlers, in
    threads or processes, never interleave.
    """
    global _latency_fd
    at = time.time()
    if _latency_fd is None:
        _latency_fd = os.open(latency_file(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.write(_latency_fd, f"{key} {at!r}\n".encode())


def version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
