"""The scenarios, written once and run against every queue through a small adapter.

An adapter (:class:`Subject`) knows how its library enqueues, how its worker is started as a
process of its own, and how to read its jobs' progress from the database. The scenarios here
time them all the same way:

* enqueue: ``n`` jobs, one public-API call each, each its own transaction; and ``n`` jobs through
  the bulk API in calls of ``chunk`` jobs, each call its own transaction.
* drain: ``n`` no-op jobs enqueued beforehand (then ``VACUUM ANALYZE``); the clock starts just
  before the worker process is spawned (interpreter and library start-up included) and stops at
  the last completion the database recorded (its own timestamp when the library stores one,
  otherwise the moment polling saw no job left).
* latency: a worker started and idle (it has run a warm-up job and waited a second), then ``n``
  jobs enqueued ``interval`` seconds apart on a fixed schedule; each handler's first act is to
  append ``<key> <time.time()>`` to a file, compared with ``time.time()`` taken just before the
  enqueue call.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from benchmarks import common


class Subject:
    """One queue library on its own database."""

    #: Its name in the table.
    name: ClassVar[str] = ""
    #: Whether its drain-mode worker exits by itself once no job is left.
    worker_exits: ClassVar[bool] = False
    #: Tables to VACUUM ANALYZE after filling the queue for a drain.
    tables: ClassVar[Sequence[str]] = ()

    def __init__(self, url: str, env: dict[str, str]) -> None:
        self.url = url
        self.env = env
        self._connection: Any = None

    # Database access for the harness (never the library's own connections).
    @property
    def connection(self) -> Any:
        import psycopg

        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(self.url, autocommit=True)
        return self._connection

    def scalar(self, query: str, params: Sequence[Any] = ()) -> Any:
        row = self.connection.execute(query, params).fetchone()
        return None if row is None else row[0]

    def vacuum(self) -> None:
        for table in self.tables:
            self.connection.execute(f"VACUUM ANALYZE {table}")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    # What each adapter provides.
    def setup(self) -> None:
        """Install the schema (once per run, on a fresh database)."""

    def reset(self) -> None:
        """Remove every job (and its history)."""
        raise NotImplementedError

    def enqueue_single(self, n: int) -> None:
        """``n`` enqueues of a no-op job, one call and one transaction each."""
        raise NotImplementedError

    def enqueue_many(self, n: int, chunk: int) -> None:
        """``n`` no-op jobs through the bulk API, ``chunk`` per call (and transaction)."""
        raise NotImplementedError

    def prefill(self, n: int) -> None:
        """Fill the queue with ``n`` no-op jobs for a drain (not timed)."""
        self.enqueue_many(n, 10_000)

    def enqueue_probe(self, key: int) -> None:
        """Enqueue one probe job (its handler records its start under ``key``)."""
        raise NotImplementedError

    def worker_argv(self, mode: str, options: dict[str, Any]) -> list[str]:
        """The command of a worker: ``mode`` is "drain" (no-op jobs) or "serve" (probes)."""
        raise NotImplementedError

    def count(self) -> int:
        """Jobs in the queue, whatever their state (for checks)."""
        raise NotImplementedError

    def pending(self) -> int:
        """Jobs not finished yet."""
        raise NotImplementedError

    def completed(self) -> int:
        """Jobs finished successfully (still in the table or in its log)."""
        raise NotImplementedError

    def last_completion(self) -> float | None:
        """Epoch of the last completion as the database recorded it; None if it doesn't."""
        return None


# --------------------------------------------------------------------------------------------------
# Scenarios


def enqueue_single(subject: Subject, n: int) -> float:
    subject.reset()
    with common.timed() as elapsed:
        subject.enqueue_single(n)
    _check_count(subject, n)
    return n / elapsed[0]


def enqueue_many(subject: Subject, n: int, chunk: int) -> float:
    subject.reset()
    with common.timed() as elapsed:
        subject.enqueue_many(n, chunk)
    _check_count(subject, n)
    return n / elapsed[0]


def _check_count(subject: Subject, n: int) -> None:
    stored = subject.count()
    if stored != n:
        raise RuntimeError(f"{n} jobs enqueued but {stored} stored")


def drain(
    subject: Subject,
    n: int,
    options: dict[str, Any] | None = None,
    *,
    log_dir: Path,
    timeout: float,
    prefilled: bool = False,
) -> float:
    """Jobs per second from worker spawn to last completion."""
    options = options or {}
    if not prefilled:
        subject.reset()
        subject.prefill(n)
    subject.vacuum()
    if subject.pending() != n:
        raise RuntimeError(f"expected {n} pending jobs, found {subject.pending()}")
    log = log_dir / f"{subject.name}-drain-{time.time():.3f}.log"
    worker = common.WorkerProcess(subject.worker_argv("drain", options), subject.env, log)
    started = worker.started_at
    try:
        if subject.worker_exits:
            code = worker.wait(timeout)
            seen = time.time()
            if code != 0:
                raise RuntimeError(f"worker exited with {code}: {worker.tail()}")
        else:
            seen = common.wait_until(
                lambda: subject.pending() == 0 or not worker.alive(),
                timeout,
                interval=0.05,
                what=f"{subject.name} to drain {n} jobs",
            )
            if not worker.alive():
                raise RuntimeError(f"worker died: {worker.tail()}")
    finally:
        worker.stop()
    done = subject.completed()
    if done != n:
        raise RuntimeError(f"{done} of {n} jobs completed ({subject.pending()} pending)")
    ended = subject.last_completion() or seen
    return n / (ended - started)


def latency(
    subject: Subject,
    n: int,
    interval: float,
    options: dict[str, Any] | None = None,
    *,
    log_dir: Path,
    timeout: float,
) -> dict[str, float]:
    """Enqueue call → handler start, in milliseconds: p50, p95, p99 (and the max)."""
    subject.reset()
    with _latency_file() as path:
        env = {**subject.env, "BENCH_LATENCY_FILE": str(path)}
        log = log_dir / f"{subject.name}-latency-{time.time():.3f}.log"
        worker = common.WorkerProcess(subject.worker_argv("serve", options or {}), env, log)
        try:
            # Warm-up: the worker is up, has its connections and has run a job; then idles.
            subject.enqueue_probe(-1)
            common.wait_until(
                lambda: -1 in common.read_latency_file(path) or not worker.alive(),
                timeout,
                interval=0.05,
                what=f"{subject.name}'s worker to start",
            )
            if not worker.alive():
                raise RuntimeError(f"worker died: {worker.tail()}")
            time.sleep(1.0)
            enqueued: dict[int, float] = {}
            start = time.monotonic()
            for key in range(n):
                pause = start + key * interval - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                enqueued[key] = time.time()
                subject.enqueue_probe(key)
            common.wait_until(
                lambda: len(common.read_latency_file(path)) > n or not worker.alive(),
                timeout,
                interval=0.1,
                what=f"{subject.name} to run {n} probe jobs",
            )
            if not worker.alive():
                raise RuntimeError(f"worker died: {worker.tail()}")
        finally:
            worker.stop()
        starts = common.read_latency_file(path)
    delays = [(starts[key] - enqueued[key]) * 1000 for key in range(n)]
    return {**common.percentiles(delays), "max": max(delays)}


@contextlib.contextmanager
def _latency_file() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="eddyq-bench-") as folder:
        path = Path(folder) / "starts.txt"
        path.touch()
        Path(folder).chmod(0o777)
        path.chmod(0o666)
        yield path


# --------------------------------------------------------------------------------------------------
# A subject process's round


def chosen_options(
    option_sets: dict[str, dict[str, Any]], config: dict[str, Any]
) -> dict[str, Any]:
    """A peer's options for a setup or round: ``config["options"]`` when given (a candidate of
    benchmarks/peer_options.py), otherwise its set named ``config["peer_options"]``, "best"
    unless told."""
    if "options" in config:
        return dict(config["options"])
    return dict(option_sets[config.get("peer_options", "best")])


def guarded(results: dict[str, Any], key: str, measure: Any, *args: Any, **kwargs: Any) -> None:
    """Store ``measure(...)`` under ``key``, or ``{"error": ...}`` if it fails."""
    try:
        results[key] = measure(*args, **kwargs)
    except Exception as error:  # a failing scenario must not cost the others
        results[key] = {"error": f"{type(error).__name__}: {error}"[:300]}


def standard_round(subject: Subject, config: dict[str, Any]) -> dict[str, Any]:
    """Enqueue single, enqueue many, drain and latency, as the config asks."""
    results: dict[str, Any] = {}
    log_dir = Path(config["log_dir"])
    wanted = set(config.get("scenarios") or ["single", "many", "drain", "latency"])
    timeout = config.get("timeout", 600)
    if "single" in wanted:
        guarded(results, "enqueue_single", enqueue_single, subject, config["single"])
    if "many" in wanted:
        guarded(results, "enqueue_many", enqueue_many, subject, config["many"], config["chunk"])
    if "drain" in wanted:
        guarded(
            results,
            "drain",
            drain,
            subject,
            config["drain"],
            config.get("drain_options"),
            log_dir=log_dir,
            timeout=timeout,
        )
    if "latency" in wanted:
        guarded(
            results,
            "latency",
            latency,
            subject,
            config["latency"],
            config["interval"],
            log_dir=log_dir,
            timeout=timeout,
        )
    subject.reset()
    subject.close()
    return results
