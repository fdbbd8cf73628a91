"""django-eddyq as a benchmark subject: its public API, its worker command, its tables.

Runs with Django set up on ``DATABASE_URL`` (one of the benchmark's own databases) and the test
project's settings, DEBUG off. Also measures the bare Django ORM insert of the same row, the
drain with a million completed rows retained, and prints the plans of the hot statements.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import common, harness
from benchmarks.drain import INSTRUMENTED_ARGUMENTS, INSTRUMENTED_ENVIRONMENT, drain_once

NOOP = "benchmarks.noop.noop"
# Flow control's rows: jobs of 5 ms in a queue of their own, drained by four worker processes of
# --concurrency 10 (40 slots), with and without a limit on that queue.
FLOW_QUEUE = "bench_flow"
FLOW_JOB_SECONDS = 0.005
FLOW_WORKERS = {"concurrency": 10, "processes": 4}
FLOW_LIMITS: list[tuple[str, dict[str, Any]]] = [
    ("flow_unlimited", {}),
    ("flow_concurrency40", {"concurrency": 40}),
    ("flow_rate2000", {"rate": "2000/s"}),
]
# The keyed row: the same drain, of jobs of one task limited to one running per customer, with
# twenty jobs per customer (in a shuffled order) and as many customers as that makes.
FLOW_KEYED = "flow_keys_limit1"
FLOW_JOBS_PER_KEY = 20
# Workflows' rows: a fan-out and fan-in (one step, then the rest side by side, then one after them
# all) enqueued, and chains of no-op steps drained against as many plain no-op jobs, both by one
# serving worker process of --concurrency 10.
WORKFLOW_WORKER = {"concurrency": 10}
WORKFLOW_TABLES = "eddyq_jobs, eddyq_workflows, eddyq_workflow_steps, eddyq_workflow_edges"


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()


class Eddyq(harness.Subject):
    name = "django-eddyq"
    worker_exits = True
    tables = ("eddyq_jobs",)

    def setup(self) -> None:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def reset(self) -> None:
        self.connection.execute("TRUNCATE eddyq_jobs")

    def enqueue_single(self, n: int) -> None:
        from benchmarks.noop import noop

        for _ in range(n):
            noop.enqueue()

    def enqueue_many(self, n: int, chunk: int) -> None:
        from benchmarks.noop import noop

        for start in range(0, n, chunk):
            noop.enqueue_many([()] * min(chunk, n - start))

    def enqueue_probe(self, key: int) -> None:
        from benchmarks.probe import probe

        probe.enqueue(key)

    def worker_argv(self, mode: str, options: dict[str, Any]) -> list[str]:
        argv = [sys.executable, str(common.MANAGE), "eddyq_worker"]
        argv += ["--concurrency", str(options.get("concurrency", 10))]
        if options.get("processes", 1) > 1:
            argv += ["--processes", str(options["processes"])]
        if mode == "drain":
            argv.append("--burst")
        if options.get("instrumented"):
            argv += INSTRUMENTED_ARGUMENTS
        return argv

    def count(self) -> int:
        return self.scalar("SELECT count(*) FROM eddyq_jobs")

    def steady(self) -> float:
        """Jobs/s of the last drain from its first claim to its last completion (the database's
        clock): the drain without the worker's start-up."""
        return self.scalar(
            "SELECT count(*) / extract(epoch FROM max(finalized_at) - min(attempted_at))::float8"
            " FROM eddyq_jobs WHERE state = 'completed'"
        )

    def pending(self) -> int:
        return self.scalar(
            "SELECT count(*) FROM eddyq_jobs"
            " WHERE state IN ('scheduled', 'available', 'running', 'retryable')"
        )

    def completed(self) -> int:
        return self.scalar("SELECT count(*) FROM eddyq_jobs WHERE state = 'completed'")

    def last_completion(self) -> float | None:
        return self.scalar(
            "SELECT extract(epoch FROM max(finalized_at))::float8 FROM eddyq_jobs"
            " WHERE state = 'completed'"
        )


class Retained(Eddyq):
    """The same queue, its table holding a million completed jobs that are left in place."""

    name = "django-eddyq-retained"

    def reset(self) -> None:
        self.connection.execute("DELETE FROM eddyq_jobs WHERE id > %s", [self.retained_max_id()])

    def retained_max_id(self) -> int:
        return self.scalar("SELECT max_id FROM bench_retained") or 0

    def completed(self) -> int:
        return self.scalar(
            "SELECT count(*) FROM eddyq_jobs WHERE state = 'completed' AND id > %s",
            [self.retained_max_id()],
        )

    def last_completion(self) -> float | None:
        return self.scalar(
            "SELECT extract(epoch FROM max(finalized_at))::float8 FROM eddyq_jobs"
            " WHERE state = 'completed' AND id > %s",
            [self.retained_max_id()],
        )


class Atomic(Eddyq):
    """The same queue, its no-op jobs atomic: each completion its own commit, in the handler's
    transaction (docs/atomic-handlers.md). The handlers' Django connections persist from job to
    job (``conn_max_age``), as they should wherever handlers use the database: otherwise each
    job would also pay for a connection."""

    name = "django-eddyq-atomic"

    def __init__(self, url: str, env: dict[str, str]) -> None:
        persistent = f"{url}{'&' if '?' in url else '?'}conn_max_age=60"
        super().__init__(url, {**env, "DATABASE_URL": persistent})

    def enqueue_many(self, n: int, chunk: int) -> None:
        from benchmarks.noop import atomic_noop

        for start in range(0, n, chunk):
            atomic_noop.enqueue_many([()] * min(chunk, n - start))


class Paced(Eddyq):
    """The same queue, drained of 5 ms jobs in flow control's queue by workers that serve
    (without ``--burst``: a burst worker exits at its first claim that takes nothing, which
    with a limit may be one that found every slot of the queue taken by the other workers);
    the drain ends at the last completion the database recorded."""

    name = "django-eddyq-5ms"
    worker_exits = False

    def worker_argv(self, mode: str, options: dict[str, Any]) -> list[str]:
        return [arg for arg in super().worker_argv(mode, options) if arg != "--burst"]

    def prefill(self, n: int) -> None:
        from benchmarks.noop import pause

        paced = pause.using(queue=FLOW_QUEUE)
        for start in range(0, n, 10_000):
            paced.enqueue_many([(FLOW_JOB_SECONDS,)] * min(10_000, n - start))


class PacedPerKey(Paced):
    """``Paced``, of jobs limited to one running per customer, by workers that declare their
    task (``benchmarks.keyed``)."""

    def __init__(self, url: str, env: dict[str, str]) -> None:
        modules = f"{env['EDDYQ_TASK_MODULES']},benchmarks.keyed"
        super().__init__(url, {**env, "EDDYQ_TASK_MODULES": modules})

    def prefill(self, n: int) -> None:
        from benchmarks.keyed import pause_per_customer

        customers = [job // FLOW_JOBS_PER_KEY for job in range(n)]
        random.Random(n).shuffle(customers)
        paced = pause_per_customer.using(queue=FLOW_QUEUE)
        for start in range(0, n, 10_000):
            paced.enqueue_many(
                [(FLOW_JOB_SECONDS, customer) for customer in customers[start : start + 10_000]]
            )


class Serving(Eddyq):
    """The queue drained of no-op jobs by a worker that serves (not ``--burst``), to the last
    completion the database recorded: a chain's next step is released only as the one before
    it ends, so a burst worker's idea of a drained queue does not hold, and the plain drain it
    is compared with is measured alike. Counts a workflow's pending steps as waiting."""

    name = "django-eddyq-serving"
    worker_exits = False
    tables = ("eddyq_jobs", "eddyq_workflow_steps", "eddyq_workflow_edges")

    def worker_argv(self, mode: str, options: dict[str, Any]) -> list[str]:
        return [arg for arg in super().worker_argv(mode, options) if arg != "--burst"]

    def reset(self) -> None:
        self.connection.execute(f"TRUNCATE {WORKFLOW_TABLES}")

    def pending(self) -> int:
        return self.scalar(
            "SELECT count(*) FROM eddyq_jobs"
            " WHERE state IN ('pending', 'scheduled', 'available', 'running', 'retryable')"
        )


class Chains(Serving):
    """``Serving``, of chains of ``length`` no-op steps, each chain a workflow of its own."""

    name = "django-eddyq-chains"

    def __init__(self, url: str, env: dict[str, str], length: int) -> None:
        super().__init__(url, env)
        self.length = length

    def prefill(self, n: int) -> None:
        from django.db import transaction

        from benchmarks.noop import noop
        from django_eddyq import chain

        with transaction.atomic():
            for _ in range(n // self.length):
                chain(*(noop.s() for _ in range(self.length))).enqueue()


def subject(config: dict[str, Any]) -> Eddyq:
    setup_django()
    return Eddyq(os.environ["DATABASE_URL"], dict(os.environ))


# --------------------------------------------------------------------------------------------------
# Commands


def setup(config: dict[str, Any]) -> dict[str, Any]:
    subject(config).setup()
    return {"ok": True}


def single_inserts(queue: Eddyq, n: int, blocks: int = 10) -> dict[str, float]:
    """``task.enqueue()`` against the plain inserts it is held to, interleaved.

    In autocommit, one job per call: ``task.enqueue()``; the bare Django ORM insert of the row it
    stores (``Job.objects.create()``); a raw psycopg ``INSERT ... RETURNING id`` of that row into
    ``eddyq_jobs``; and one into the minimal table of the raw loop (benchmarks/raw.py). Each
    does ``n`` jobs, interleaved (see ``_interleaved``). Jobs per second of each.
    """
    import psycopg
    from psycopg.types.json import Jsonb

    from benchmarks import raw
    from django_eddyq.models import Job

    connection = psycopg.connect(queue.url, autocommit=True, prepare_threshold=0)
    for statement in raw.SCHEMA.split(";"):
        if statement.strip():
            connection.execute(statement, prepare=False)
    empty_list = Jsonb([])

    def orm(count: int) -> None:
        for _ in range(count):
            Job.objects.create(
                task=NOOP, args=[], kwargs={}, queue="default", priority=0, max_attempts=25
            )

    def minimal(count: int) -> None:
        for _ in range(count):
            connection.execute(raw.INSERT, (raw.TASK, empty_list)).fetchone()

    methods = {
        "enqueue_single": queue.enqueue_single,
        "orm_insert": orm,
        "raw_insert_same_row": functools.partial(_insert_same_rows, connection),
        "raw_insert": minimal,
    }
    queue.reset()
    connection.execute("TRUNCATE raw_jobs")
    rates = _interleaved(methods, n, blocks)
    stored = queue.count()
    if stored != 3 * n:
        raise RuntimeError(f"{3 * n} rows inserted into eddyq_jobs, {stored} stored")
    connection.execute("TRUNCATE raw_jobs")
    connection.close()
    queue.reset()
    return rates


def _insert_same_rows(connection: Any, count: int) -> None:
    """The raw insert of the row ``noop.enqueue()`` stores, ``count`` times."""
    from psycopg.types.json import Jsonb

    empty_list, empty_dict = Jsonb([]), Jsonb({})
    for _ in range(count):
        connection.execute(RAW_INSERT_JOB, (NOOP, empty_list, empty_dict)).fetchone()


def _interleaved(methods: dict[str, Any], n: int, blocks: int) -> dict[str, float]:
    """Calls per second of each ``method(count)``, ``n`` calls each in ``blocks`` blocks taken
    in turn (each block starting with the next method), so that a busy spell of a shared
    machine weighs on all alike."""
    spent = dict.fromkeys(methods, 0.0)
    names = list(methods)
    for block in range(blocks):
        count = n // blocks + (1 if block < n % blocks else 0)
        for name in names[block % len(names) :] + names[: block % len(names)]:
            started = time.perf_counter()
            methods[name](count)
            spent[name] += time.perf_counter() - started
    return {name: n / spent[name] for name in methods}


RAW_INSERT_JOB = """
INSERT INTO eddyq_jobs (
    task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
    errors, metadata
)
VALUES (%s, %s, %s, 'default', 0, 'available', 0, 25, now(), now(), '[]', '{}')
RETURNING id
"""


def run_round(config: dict[str, Any]) -> dict[str, Any]:
    queue = subject(config)
    log_dir = Path(config["log_dir"])
    timeout = config.get("timeout", 600)
    wanted = set(
        config.get("scenarios") or ["single", "many", "drain", "flow", "workflows", "latency"]
    )
    results: dict[str, Any] = {}
    if "single" in wanted:
        try:
            results.update(single_inserts(queue, config["single"]))
        except Exception as error:
            results["enqueue_single"] = {"error": f"{type(error).__name__}: {error}"[:300]}
    if "many" in wanted:
        harness.guarded(
            results, "enqueue_many", harness.enqueue_many, queue, config["many"], config["chunk"]
        )
    if "drain" in wanted:
        # The instrumented and atomic rows right after the plain one they are compared with.
        instrumented = Eddyq(queue.url, {**queue.env, **INSTRUMENTED_ENVIRONMENT})
        atomic = Atomic(queue.url, queue.env)
        for key, drained, options in [
            ("drain_c1", queue, {"concurrency": 1}),
            ("drain_c10", queue, {"concurrency": 10}),
            ("drain_c10_instrumented", instrumented, {"concurrency": 10, "instrumented": True}),
            ("drain_c10_atomic", atomic, {"concurrency": 10}),
            ("drain_p2", queue, {"concurrency": 10, "processes": 2}),
        ]:
            harness.guarded(
                results,
                key,
                harness.drain,
                drained,
                config["drain"],
                options,
                log_dir=log_dir,
                timeout=timeout,
            )
            if key == "drain_c10" and isinstance(results.get(key), float):
                # What the raw loop is held to: it runs in a process that is already up.
                results["drain_c10_steady"] = queue.steady()
        instrumented.close()
        atomic.close()
    if "flow" in wanted:
        results.update(flow_control(queue, config["flow"], log_dir=log_dir, timeout=timeout))
    if "workflows" in wanted and "chains" in config:
        results.update(workflows(queue, config, log_dir=log_dir, timeout=timeout))
    if "latency" in wanted:
        harness.guarded(
            results,
            "latency",
            harness.latency,
            queue,
            config["latency"],
            config["interval"],
            log_dir=log_dir,
            timeout=timeout,
        )
    queue.reset()
    queue.close()
    return results


def flow_control(queue: Eddyq, n: int, *, log_dir: Path, timeout: float) -> dict[str, Any]:
    """The drain of ``n`` 5 ms jobs by ``FLOW_WORKERS``, once for each of ``FLOW_LIMITS`` set on
    their queue (then lifted)."""
    from django_eddyq import set_queue_limits

    paced = Paced(queue.url, queue.env)
    results: dict[str, Any] = {}
    try:
        for key, limits in FLOW_LIMITS:
            set_queue_limits(FLOW_QUEUE, **limits)
            harness.guarded(
                results,
                key,
                harness.drain,
                paced,
                n,
                FLOW_WORKERS,
                log_dir=log_dir,
                timeout=timeout,
            )
            if not isinstance(results[key], dict):  # not an error
                results[f"{key}_steady"] = paced.steady()
        set_queue_limits(FLOW_QUEUE)
        per_key = PacedPerKey(queue.url, queue.env)
        try:
            harness.guarded(
                results,
                FLOW_KEYED,
                harness.drain,
                per_key,
                n,
                FLOW_WORKERS,
                log_dir=log_dir,
                timeout=timeout,
            )
            if not isinstance(results[FLOW_KEYED], dict):
                results[f"{FLOW_KEYED}_steady"] = per_key.steady()
        finally:
            per_key.reset()
            per_key.close()
    finally:
        set_queue_limits(FLOW_QUEUE)
        paced.reset()
        paced.close()
    return results


def workflows(
    queue: Eddyq, config: dict[str, Any], *, log_dir: Path, timeout: float
) -> dict[str, Any]:
    """``workflow_enqueue``: seconds to build and enqueue a fan-out and fan-in of
    ``workflow_steps`` steps (the median of three); ``workflow_chains``: jobs/s of the drain of
    ``chains`` chains of ``chain_length`` steps, and ``workflow_plain``: of as many plain jobs,
    by the same serving worker (with ``_steady``: from the first claim to the last completion,
    without the worker's start-up)."""
    results: dict[str, Any] = {}
    serving = Serving(queue.url, queue.env)
    chains = Chains(queue.url, queue.env, config["chain_length"])
    try:
        harness.guarded(
            results, "workflow_enqueue", fan_out_and_in, serving, config["workflow_steps"]
        )
        jobs = config["chains"] * config["chain_length"]
        for key, drained in [("workflow_plain", serving), ("workflow_chains", chains)]:
            harness.guarded(
                results,
                key,
                harness.drain,
                drained,
                jobs,
                WORKFLOW_WORKER,
                log_dir=log_dir,
                timeout=timeout,
            )
            if not isinstance(results[key], dict):  # not an error
                results[f"{key}_steady"] = drained.steady()
    finally:
        serving.reset()
        serving.close()
        chains.close()
    return results


def fan_out_and_in(queue: Serving, steps: int, rounds: int = 3) -> float:
    """Seconds to build and enqueue one step, ``steps - 2`` after it, and one after them all."""
    from benchmarks.noop import noop
    from django_eddyq import Workflow

    spent = []
    for _ in range(rounds):
        queue.reset()
        started = time.perf_counter()
        workflow = Workflow("fan")
        first = workflow.add(noop.s(), name="first")
        middle = [workflow.add(noop.s(), after=[first]) for _ in range(steps - 2)]
        workflow.add(noop.s(), after=middle, name="last")
        workflow.enqueue()
        spent.append(time.perf_counter() - started)
        stored = queue.scalar("SELECT count(*) FROM eddyq_workflow_steps")
        if stored != steps:
            raise RuntimeError(f"{steps} steps enqueued, {stored} stored")
    queue.reset()
    return common.median(spent)


# Retained history ---------------------------------------------------------------------------------

LOAD_RETAINED = """
INSERT INTO eddyq_jobs (
    task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
    attempted_at, finalized_at, errors, result, metadata
)
SELECT %(task)s, '[]'::jsonb, '{}'::jsonb, 'default', 0, 'completed', 1, 25,
       now() - make_interval(secs => 43200 - i * 0.04),
       now() - make_interval(secs => 43200 - i * 0.04),
       now() - make_interval(secs => 43200 - i * 0.04),
       now() - make_interval(secs => 43200 - i * 0.04 - 0.01),
       '[]'::jsonb, NULL, '{}'::jsonb
FROM generate_series(%(first)s, %(last)s) AS i
"""


def load_retained(config: dict[str, Any]) -> dict[str, Any]:
    """Migrate, then store ``rows`` completed jobs (finalized over the last 12 hours)."""
    queue = subject(config)
    queue.setup()
    rows = config["rows"]
    started = time.perf_counter()
    connection = queue.connection
    for first in range(0, rows, 100_000):
        connection.execute(
            LOAD_RETAINED,
            {"task": NOOP, "first": first, "last": min(first + 100_000, rows) - 1},
        )
    connection.execute("VACUUM ANALYZE eddyq_jobs")
    connection.execute("CREATE TABLE IF NOT EXISTS bench_retained (max_id bigint)")
    connection.execute("TRUNCATE bench_retained")
    connection.execute("INSERT INTO bench_retained SELECT max(id) FROM eddyq_jobs")
    size = queue.scalar("SELECT pg_size_pretty(pg_total_relation_size('eddyq_jobs'))")
    queue.close()
    return {"rows": rows, "seconds": time.perf_counter() - started, "size": size}


def retained_round(config: dict[str, Any]) -> dict[str, Any]:
    """Drain on an empty table, then on the table holding the retained rows, back to back."""
    setup_django()
    log_dir = Path(config["log_dir"])
    timeout = config.get("timeout", 600)
    empty = Eddyq(config["empty_url"], {**os.environ, "DATABASE_URL": config["empty_url"]})
    full = Retained(config["retained_url"], {**os.environ, "DATABASE_URL": config["retained_url"]})
    results: dict[str, Any] = {}
    for key, queue in [("drain_empty", empty), ("drain_retained", full)]:
        queue.reset()
        _prefill(queue, config["drain"])
        harness.guarded(
            results,
            key,
            harness.drain,
            queue,
            config["drain"],
            {"concurrency": 10},
            log_dir=log_dir,
            timeout=timeout,
            prefilled=True,
        )
        queue.reset()
        queue.close()
    return results


def _prefill(queue: Eddyq, n: int) -> None:
    """enqueue_many into ``queue``'s database, whichever Django's connection points at."""
    import psycopg

    from benchmarks.noop import noop
    from django_eddyq import enqueue
    from django_eddyq.enqueue import JobSpec

    with psycopg.connect(queue.url, autocommit=True) as connection:
        for start in range(0, n, 10_000):
            specs = [JobSpec.for_task(noop, (), {}) for _ in range(min(10_000, n - start))]
            with connection.cursor() as cursor:
                enqueue.insert_jobs(specs, cursor=cursor)


# Limits -------------------------------------------------------------------------------------------


def limits(config: dict[str, Any]) -> dict[str, Any]:
    """What bounds the bulk enqueue and the drain, measured apart from the library's Python.

    * ``copy_*``: rows/s of ``COPY`` of the very rows ``enqueue_many`` wrote (read back as
      COPY text, so no Python builds them while the clock runs), in the same transactions of
      ``chunk`` rows: into ``eddyq_jobs``, and into a scratch copy of it without the per-queue
      claim index, then without either claim index (the primary key alone: every other index
      is partial and takes no available job). What each index costs every enqueue.
    * ``single_*``: calls/s of ``task.enqueue()``, of its own ``INSERT`` sent by plain psycopg,
      and of the raw insert of the same row, interleaved.
    * ``idle_worker_s``: ``eddyq_worker --burst`` with nothing to do, spawn to exit: Python,
      Django, the checks, the connections — paid by every drain row of the table.
    * ``drain_start_s``, ``drain_steady``: one drain at ``--concurrency 10`` split at its first
      claim (the database's ``attempted_at``): seconds from spawn, then jobs/s to the last
      completion.
    """
    queue = subject(config)
    n, chunk = config["many"], config["chunk"]
    connection = queue.connection
    queue.reset()
    queue.enqueue_many(n, chunk)
    with connection.cursor() as cursor:
        rows: list[bytes] = []
        with cursor.copy(_copy_statement("eddyq_jobs", "TO STDOUT")) as copy:
            rows.extend(bytes(line) for line in copy)
    if len(rows) != n:
        raise RuntimeError(f"read back {len(rows)} rows of {n}")
    connection.execute("DROP TABLE IF EXISTS bench_limits_jobs")
    connection.execute("CREATE TABLE bench_limits_jobs (LIKE eddyq_jobs INCLUDING ALL)")
    try:
        results = {"copy_eddyq_jobs": _copy_rate(connection, "eddyq_jobs", rows, chunk)}
        for key, index_start in [
            ("copy_without_queue_claim_index", "(queue, priority DESC"),
            ("copy_without_claim_indexes", "(priority DESC"),
        ]:
            connection.execute(_drop_index(connection, "bench_limits_jobs", index_start))
            results[key] = _copy_rate(connection, "bench_limits_jobs", rows, chunk)
    finally:
        connection.execute("DROP TABLE IF EXISTS bench_limits_jobs")

    results.update(_single_statements(queue, config["single"]))

    log_dir = Path(config["log_dir"])
    queue.reset()
    idle = common.WorkerProcess(
        queue.worker_argv("drain", {}), queue.env, log_dir / f"limits-idle-{time.time():.3f}.log"
    )
    if idle.wait(config["timeout"]) != 0:
        raise RuntimeError(f"idle worker failed: {idle.tail()}")
    results["idle_worker_s"] = time.time() - idle.started_at
    idle.stop()

    _, results["drain_start_s"], results["drain_steady"] = drain_once(
        config["drain"], ["--concurrency", "10"], timeout=config["timeout"]
    )
    queue.reset()
    queue.close()
    return results


def _single_statements(queue: Eddyq, n: int) -> dict[str, float]:
    """``task.enqueue()``, its own statement sent by plain psycopg with the parameters it sends,
    and the raw insert of the same row, interleaved: the statement's cost on the server (its
    ``NOTIFY``, what it returns) apart from the Python around it."""
    import psycopg

    from django_eddyq import sql

    connection = psycopg.connect(queue.url, autocommit=True, prepare_threshold=0)
    params = {
        "task": NOOP,
        "args": "[]",
        "kwargs": "{}",
        "queue": "default",
        "priority": 0,
        "max_attempts": 25,
        "run_at": None,
        "delay": 0.0,
        "retention": None,
        "metadata": "{}",
        "batch_id": None,
    }

    def own_statement(count: int) -> None:
        for _ in range(count):
            connection.execute(sql.INSERT_ONE_JOB, params).fetchone()

    queue.reset()
    rates = _interleaved(
        {
            "single_enqueue": queue.enqueue_single,
            "single_own_statement": own_statement,
            "single_same_row": functools.partial(_insert_same_rows, connection),
        },
        n,
        blocks=10,
    )
    connection.close()
    queue.reset()
    return rates


def _copy_rate(connection: Any, table: str, rows: list[bytes], chunk: int) -> float:
    connection.execute(f"TRUNCATE {table}")
    with common.timed() as elapsed:
        for start in range(0, len(rows), chunk):
            with (
                connection.transaction(),
                connection.cursor() as cursor,
                cursor.copy(_copy_statement(table, "FROM STDIN")) as copy,
            ):
                copy.write(b"".join(rows[start : start + chunk]))
    connection.execute(f"TRUNCATE {table}")
    return len(rows) / elapsed[0]


def _copy_statement(table: str, direction: str) -> str:
    """enqueue_many's own COPY of jobs due at once, on ``table``: ``direction`` is
    ``FROM STDIN`` or ``TO STDOUT``."""
    from django_eddyq import sql

    return sql.COPY_JOBS_RUN_AT_NOW.replace("eddyq_jobs", table, 1).replace("FROM STDIN", direction)


def _drop_index(connection: Any, table: str, columns_start: str) -> str:
    """``DROP INDEX`` of the index of ``table`` on the available jobs whose columns start so:
    the claim's (``limit_key IS NULL``), not the keyed claim's, which a no-op job never enters."""
    names = [
        name
        for name, definition in connection.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table]
        )
        if f"btree {columns_start}" in definition
        and "'available'" in definition
        and "limit_key IS NULL" in definition
    ]
    if len(names) != 1:
        raise RuntimeError(f"{table}: expected one index on {columns_start}..., found {names}")
    return f"DROP INDEX {names[0]}"


# Plans --------------------------------------------------------------------------------------------


def plans(config: dict[str, Any]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of claim, heartbeat and finish, then rolled back.

    On the retained database: a million completed jobs and ``available`` no-op jobs waiting.
    Each statement runs in a transaction that is rolled back, so the table is left as it was.
    Also the generic plan (what a prepared statement may settle on after five executions).
    """
    import psycopg

    from django_eddyq import sql
    from django_eddyq.db import numbered_parameters

    setup_django()
    url = config["retained_url"]
    queue = Retained(url, {**os.environ, "DATABASE_URL": url})
    queue.reset()
    _prefill(queue, config["available"])
    queue.vacuum()
    worker_id = "bench:plans"
    out: dict[str, Any] = {
        "rows": queue.scalar("SELECT count(*) FROM eddyq_jobs"),
        "available": queue.scalar("SELECT count(*) FROM eddyq_jobs WHERE state = 'available'"),
        "plans": {},
    }
    claim = sql.claim_statement(10, None)
    claim_params = {"worker_id": worker_id, "lease_seconds": 60.0}
    with psycopg.connect(url) as connection:
        cursor = psycopg.ClientCursor(connection)

        def explain(statement: str, params: dict[str, Any]) -> list[str]:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement, params)
            return [row[0] for row in cursor.fetchall()]

        def generic(statement: str) -> list[str]:
            # GENERIC_PLAN takes $n parameters.
            numbered = numbered_parameters(statement)[0]
            rows = connection.execute("EXPLAIN (GENERIC_PLAN, COSTS OFF) " + numbered).fetchall()
            return [row[0] for row in rows]

        # Claim, preceded in its transaction by what the worker sends before it.
        cursor.execute(sql.CLAIM_WITHOUT_SORT)
        out["plans"]["claim (claim_statement, 10 jobs)"] = explain(claim, claim_params)
        connection.rollback()
        # Heartbeat and finish: of jobs this transaction has just claimed.
        cursor.execute(sql.CLAIM_WITHOUT_SORT)
        cursor.execute(claim, claim_params)
        claimed = cursor.fetchall()
        ids = [row[0] for row in claimed]
        attempts = [row[7] for row in claimed]
        out["plans"]["heartbeat (HEARTBEAT, 10 jobs)"] = explain(
            sql.HEARTBEAT, {"ids": ids, "worker_id": worker_id, "lease_seconds": 60.0}
        )
        out["plans"]["finish (FINISH_JOBS, 10 jobs)"] = explain(
            sql.FINISH_JOBS,
            {
                "worker_id": worker_id,
                "outcomes": json.dumps(
                    [
                        {"id": job_id, "attempt": attempt, "state": "completed"}
                        for job_id, attempt in zip(ids, attempts, strict=True)
                    ]
                ),
            },
        )
        connection.rollback()
        # EXPLAIN (GENERIC_PLAN) came with PostgreSQL 16.
        for label, statement in [
            ("claim (generic plan)", claim),
            ("heartbeat (generic plan)", sql.HEARTBEAT),
            ("finish (generic plan)", sql.FINISH_JOBS),
        ]:
            if connection.info.server_version < 160000:
                out["plans"][label] = ["(EXPLAIN (GENERIC_PLAN) needs PostgreSQL 16 or later)"]
                continue
            if statement is claim:
                connection.execute(sql.CLAIM_WITHOUT_SORT)
            out["plans"][label] = generic(statement)
            connection.rollback()
    queue.reset()
    queue.close()
    return out


if __name__ == "__main__":
    common.subject_main(
        {
            "setup": setup,
            "round": run_round,
            "load_retained": load_retained,
            "retained_round": retained_round,
            "plans": plans,
            "limits": limits,
        }
    )
