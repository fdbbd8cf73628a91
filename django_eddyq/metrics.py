"""Prometheus metrics of the queue: what jobs go through, and what the database holds.

Two kinds, exposed together (see docs/observability.md#metrics):

* **Counted in the process**, by receivers of the job signals, once metrics are on
  (``EDDYQ["METRICS"]``, or ``eddyq_worker --metrics-port``): jobs enqueued and finished, how
  long handlers ran and how long jobs waited past their due time.
* **Read from the database** at each scrape, by one statement of bounded cost
  (``sql.METRICS_GAUGES``) under a short ``statement_timeout``: jobs per queue and state, each
  queue's latency (how long its oldest due available job has waited) and whether it is paused.
  A scrape that cannot read them still answers, with ``eddyq_database_up 0``.

``prometheus_client`` is an optional dependency (``pip install "django-eddyq[prometheus]"``).
Importing this module never imports it: that happens once metrics are turned on, exposed or
read, so that a project without metrics pays nothing for them.

Under ``eddyq_worker --processes P`` the counters of every worker process are combined through
prometheus_client's multiprocess mode: the command points ``PROMETHEUS_MULTIPROC_DIR`` at a
fresh directory before forking (``use_multiprocess_directory``), each child writes its values to
files there, and the supervisor, which serves ``/metrics``, sums them (``MultiProcessCollector``).
"""

from __future__ import annotations

import atexit
import collections
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache

from django_eddyq import db, signals, sql
from django_eddyq.conf import InvalidSettingError, eddyq_settings
from django_eddyq.vocabulary import TERMINAL_STATES, WAITING_STATES, JobState

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.metrics_core import Metric

    from django_eddyq.worker.execution import ClaimedJob

logger = logging.getLogger(__name__)

INSTALL = 'pip install "django-eddyq[prometheus]"'
#: prometheus_client's variable naming the directory of multiprocess mode.
MULTIPROCESS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

#: Buckets of the run and wait histograms, in seconds: from a few milliseconds to hours.
BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    1800.0,
    3600.0,
    10800.0,
)

#: Counts per queue and state are exact up to here; past it they are estimates.
COUNT_LIMIT = 10_000
#: Terminal states (completed, failed, cancelled) are counted exactly up to here; past it their
#: split by queue comes from their latest finalized jobs, scaled to the planner's estimate.
TERMINAL_SAMPLE = 1_000
#: Queues with gauges, at most (the first by name).
QUEUE_LIMIT = 1_000
#: How long a scrape's database read may take, connection included, in seconds.
READ_TIMEOUT = 2.0

# The states read together, and how many rows of them the statement reads at most.
_SAMPLED_GROUPS: tuple[tuple[tuple[str, ...], int], ...] = (
    ((JobState.RUNNING.value,), COUNT_LIMIT),
    ((JobState.PENDING.value,), COUNT_LIMIT),  # workflows' steps waiting for others
    (WAITING_STATES, COUNT_LIMIT),
    *(((state,), TERMINAL_SAMPLE) for state in TERMINAL_STATES),
)


def installed() -> bool:
    """Whether prometheus_client can be imported (it is, then)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    """Raise ``ImproperlyConfigured``, saying what to install, without prometheus_client."""
    if not installed():
        raise ImproperlyConfigured(
            f"Metrics need prometheus-client, which is not installed: {INSTALL}"
        )


# Counted in the process.


@dataclass
class Instruments:
    """The counters and histograms of this process.

    The series of each label values are kept once made (``labels()`` takes a lock and checks
    its arguments at each call, which cost more than the count itself), in plain dicts: the
    receivers run for every attempt, on the worker's busiest threads.
    """

    enqueued: Counter
    finished: Counter
    run_seconds: Histogram
    wait_seconds: Histogram
    #: (task, queue, outcome) -> the series of eddyq_jobs_finished and eddyq_job_run_seconds.
    finished_series: dict[tuple[str, str, str], tuple[Any, Any]] = field(default_factory=dict)
    #: (task, queue) -> the series of eddyq_job_wait_seconds.
    wait_series: dict[tuple[str, str], Any] = field(default_factory=dict)

    @classmethod
    def create(cls) -> Instruments:
        from prometheus_client import Counter, Histogram

        # Registered in no registry: each exposition adds them to its own (see registry()).
        return cls(
            enqueued=Counter(
                "eddyq_jobs_enqueued",
                "Jobs enqueued, by task and queue.",
                ["task", "queue"],
                registry=None,
            ),
            finished=Counter(
                "eddyq_jobs_finished",
                "Attempts ended, by task, queue and outcome (completed, retried, snoozed, "
                "failed, discarded, cancelled, handed back).",
                ["task", "queue", "outcome"],
                registry=None,
            ),
            run_seconds=Histogram(
                "eddyq_job_run_seconds",
                "How long handlers ran, by task and queue.",
                ["task", "queue"],
                buckets=BUCKETS,
                registry=None,
            ),
            wait_seconds=Histogram(
                "eddyq_job_wait_seconds",
                "How long jobs waited from their due time to their handler's start, by task "
                "and queue.",
                ["task", "queue"],
                buckets=BUCKETS,
                registry=None,
            ),
        )

    def collectors(self) -> tuple[Counter | Histogram, ...]:
        return (self.enqueued, self.finished, self.run_seconds, self.wait_seconds)

    # A race makes a series twice: labels() returns the same one.

    def new_finished_series(self, key: tuple[str, str, str]) -> tuple[Any, Any]:
        task, queue, outcome = key
        series = self.finished.labels(task, queue, outcome), self.run_seconds.labels(task, queue)
        self.finished_series[key] = series
        return series

    def new_wait_series(self, key: tuple[str, str]) -> Any:
        series = self.wait_series[key] = self.wait_seconds.labels(*key)
        return series


_INF = math.inf
_lock = threading.Lock()
_instruments: Instruments | None = None
# On once metrics are enabled: the worker then calls job_started and job_finished.
recording = False
_RECEIVERS = "django_eddyq.metrics"


def instruments() -> Instruments:
    """This process's counters and histograms, created on first use."""
    global _instruments
    with _lock:
        if _instruments is None:
            require()
            _instruments = Instruments.create()
        return _instruments


def enabled() -> bool:
    """Whether this process counts jobs."""
    return recording


def enable() -> None:
    """Count the jobs this process enqueues, starts and finishes. Idempotent.

    Enqueues are heard through ``signals.job_enqueued``; the worker calls ``job_started`` and
    ``job_finished`` itself while ``recording`` is on: a signal's dispatch costs microseconds
    per job, which a drain of short jobs notices.
    """
    global recording
    instruments()
    recording = True
    signals.job_enqueued.connect(_enqueued, weak=False, dispatch_uid=f"{_RECEIVERS}.enqueued")


def disable() -> None:
    """Stop counting (the values so far stay)."""
    global recording
    recording = False
    signals.job_enqueued.disconnect(dispatch_uid=f"{_RECEIVERS}.enqueued")


def enable_if_configured() -> bool:
    """``enable()`` if ``EDDYQ["METRICS"]`` is on and prometheus_client is installed; as the app
    becomes ready. An invalid setting or a missing package is left to the system checks."""
    try:
        wanted = eddyq_settings.METRICS
    except InvalidSettingError:
        return False
    if not wanted or not installed():
        return False
    enable()
    return True


def _enqueued(sender: Any, jobs: Iterable[Any], **kwargs: Any) -> None:
    # enqueue_many can insert a hundred thousand jobs at once: one increment per label pair.
    counts = collections.Counter((str(job.task), str(job.queue)) for job in jobs)
    measured = _instruments or instruments()
    for (task, queue), count in counts.items():
        measured.enqueued.labels(task, queue).inc(count)


def job_started(job: ClaimedJob) -> None:
    """A handler is about to run ``job``: how long it waited past its due time. Called by the
    worker while ``recording``; never raises."""
    # job.due is the row's run_at by the database's clock: a worker whose clock is behind would
    # see a negative wait, counted as none, and a job due at -infinity an infinite one, which
    # would make the histogram's sum infinite for good: left out, as are NaN and -infinity.
    try:
        waited = time.time() - job.due
        if -_INF < waited < _INF:
            measured = _instruments or instruments()
            key = (job.task, job.queue)
            series = measured.wait_series.get(key) or measured.new_wait_series(key)
            series.observe(waited if waited > 0.0 else 0.0)
    except Exception:
        logger.exception("eddyq metrics: counting a started job failed")


def job_finished(job: ClaimedJob, outcome: str, duration: float | None) -> None:
    """An attempt's outcome was stored. Called by the worker while ``recording``; never
    raises."""
    try:
        measured = _instruments or instruments()
        key = (job.task, job.queue, outcome)
        finished, run_seconds = measured.finished_series.get(key) or measured.new_finished_series(
            key
        )
        finished.inc()
        if duration is not None and duration < _INF:
            run_seconds.observe(duration if duration > 0.0 else 0.0)
    except Exception:
        logger.exception("eddyq metrics: counting a finished job failed")


# Several processes.


def multiprocess_directory() -> str | None:
    """The directory of prometheus_client's multiprocess mode, if it is on."""
    return os.environ.get(MULTIPROCESS_VARIABLE) or None


def use_multiprocess_directory(path: str | None = None) -> str:
    """Turn prometheus_client's multiprocess mode on in this process and the ones it forks.

    ``path`` (default: a fresh temporary directory, removed as this process exits) becomes
    ``PROMETHEUS_MULTIPROC_DIR``; values made from then on live in files there, one per process,
    which the ``/metrics`` of this process sums. Call it before forking and before any job is
    counted: the instruments are made anew.
    """
    global _instruments
    require()
    from prometheus_client import values

    if path is None:
        path = tempfile.mkdtemp(prefix="eddyq-metrics-")
        owner = os.getpid()
        atexit.register(_remove_directory, path, owner)
    os.environ[MULTIPROCESS_VARIABLE] = path
    # prometheus_client chose how to keep values when it was imported; choose again.
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    with _lock:
        _instruments = None
    return path


def _remove_directory(path: str, owner: int) -> None:
    if os.getpid() == owner:  # never from a forked child that happens to run atexit handlers
        shutil.rmtree(path, ignore_errors=True)


# Read from the database.


@dataclass
class Gauges:
    """What one scrape read from the database."""

    ok: bool
    seconds: float = 0.0
    #: Jobs per (queue, state): every state of every queue read, at zero when it has none.
    jobs: dict[tuple[str, str], float] = field(default_factory=dict)
    #: Per queue, how long its oldest due available job has waited; zero with none.
    latency: dict[str, float] = field(default_factory=dict)
    paused: dict[str, bool] = field(default_factory=dict)
    #: The (queue, state) pairs of ``jobs`` that are estimates, their reads past their bound.
    estimated: set[tuple[str, str]] = field(default_factory=set)
    error: str | None = None


def gauge_parameters() -> dict[str, int]:
    """The parameters of ``sql.METRICS_GAUGES``: each read stops one row past its bound."""
    return {"limit": COUNT_LIMIT + 1, "sample": TERMINAL_SAMPLE + 1, "queue_limit": QUEUE_LIMIT}


_read_failed = False


def read_gauges(using: str | None = None, timeout: float = READ_TIMEOUT) -> Gauges:
    """Read the gauges from the queue's database, on a connection of the read's own.

    Never raises for the database: a read that fails (unreachable, too slow, refused) gives
    ``Gauges(ok=False)``, logged once until a read succeeds again.
    """
    global _read_failed
    started = time.perf_counter()
    try:
        params = db.connection_params(using)
        params.setdefault("connect_timeout", max(1, math.ceil(timeout)))
        import psycopg

        with psycopg.connect(**params, autocommit=True) as connection, connection.transaction():
            connection.execute(
                sql.METRICS_READ_SETTINGS, {"statement_timeout": f"{int(timeout * 1000)}ms"}
            )
            rows = connection.execute(sql.METRICS_GAUGES, gauge_parameters()).fetchall()
    except Exception as error:
        seconds = time.perf_counter() - started
        if not _read_failed:
            logger.warning("eddyq metrics: reading the gauges failed: %s", error)
        _read_failed = True
        return Gauges(ok=False, seconds=seconds, error=f"{type(error).__name__}: {error}")
    if _read_failed:
        logger.info("eddyq metrics: reading the gauges works again")
    _read_failed = False
    gauges = gauges_from_rows(rows)
    gauges.seconds = time.perf_counter() - started
    return gauges


def gauges_from_rows(rows: Iterable[tuple[Any, ...]]) -> Gauges:
    """The gauges from the rows of ``sql.METRICS_GAUGES``: exact counts where a read stayed
    within its bound, estimates past it (see docs/observability.md#metrics)."""
    paused: dict[str, bool] = {}
    latency: dict[str, float] = {}
    available: dict[str, int] = {}
    sampled: dict[tuple[str, str], int] = {}
    estimates: dict[str, int] = {}
    for kind, queue, state, jobs, seconds in rows:
        if kind == "queue":
            paused[queue] = bool(jobs)
        elif kind == "latency":
            latency[queue] = max(float(seconds), 0.0)
        elif kind == "available":
            available[queue] = int(jobs)
        elif kind == "sampled":
            sampled[str(queue), str(state)] = int(jobs)
        elif kind == "estimate":
            estimates[str(state)] = int(jobs)
    queues = sorted(set(paused) | set(latency) | set(available) | {q for q, _ in sampled})
    counts: dict[tuple[str, str], float] = {
        (queue, state): 0.0 for queue in queues for state in JobState.values
    }
    counts.update(_available_counts(available, estimates.get(JobState.AVAILABLE.value)))
    estimated = {
        (queue, JobState.AVAILABLE.value)
        for queue, count in available.items()
        if count > COUNT_LIMIT
    }
    for states, bound in _SAMPLED_GROUPS:
        counts.update(_sampled_counts(sampled, states, bound, estimates))
        if sum(count for (_, state), count in sampled.items() if state in states) > bound:
            estimated |= {(queue, state) for queue in queues for state in states}
    return Gauges(
        ok=True,
        jobs=counts,
        estimated=estimated,
        latency={queue: latency.get(queue, 0.0) for queue in queues},
        paused={queue: paused.get(queue, False) for queue in queues},
    )


def _available_counts(
    available: dict[str, int], estimate: int | None
) -> dict[tuple[str, str], float]:
    """Each queue's available jobs: exact up to COUNT_LIMIT; the queues past it share what the
    planner estimates beyond the exact ones, evenly, each at least COUNT_LIMIT + 1."""
    state = JobState.AVAILABLE.value
    exact = {queue: count for queue, count in available.items() if count <= COUNT_LIMIT}
    over = [queue for queue in available if queue not in exact]
    counts: dict[tuple[str, str], float] = {
        (queue, state): float(count) for queue, count in exact.items()
    }
    if over:
        beyond = max((estimate or 0) - sum(exact.values()), 0) / len(over)
        for queue in over:
            counts[queue, state] = float(max(round(beyond), COUNT_LIMIT + 1))
    return counts


def _sampled_counts(
    sampled: dict[tuple[str, str], int],
    states: tuple[str, ...],
    bound: int,
    estimates: dict[str, int],
) -> dict[tuple[str, str], float]:
    """The jobs of ``states`` per queue, from at most ``bound + 1`` rows read of them: exact
    when fewer came back, else each state's split by queue among the rows read, scaled to the
    planner's estimate of the state (never below what was read)."""
    rows = {key: count for key, count in sampled.items() if key[1] in states}
    if sum(rows.values()) <= bound:
        return {key: float(count) for key, count in rows.items()}
    counts: dict[tuple[str, str], float] = {}
    for state in states:
        of_state = {key: count for key, count in rows.items() if key[1] == state}
        read = sum(of_state.values())
        if not read:
            continue
        total = max(estimates.get(state, 0), read)
        for key, count in of_state.items():
            counts[key] = float(round(count * total / read))
    return counts


class DatabaseCollector:
    """A collector that reads the gauges from the database at each scrape."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def describe(self) -> Iterator[Metric]:
        # Without it, registering the collector would run a scrape's read.
        return iter(())

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        gauges = read_gauges(self.using)
        jobs = GaugeMetricFamily(
            "eddyq_jobs",
            f"Jobs per queue and state, read from the database: exact up to {COUNT_LIMIT:,} "
            f"({TERMINAL_SAMPLE:,} for terminal states), estimated past it.",
            labels=["queue", "state"],
        )
        for (queue, state), count in sorted(gauges.jobs.items()):
            jobs.add_metric([queue, state], count)
        latency = GaugeMetricFamily(
            "eddyq_queue_latency_seconds",
            "How long the queue's oldest due available job has waited, by the database's "
            "clock; 0 with none.",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "eddyq_queue_paused", "1 while the queue is paused.", labels=["queue"]
        )
        for queue in sorted(gauges.latency):
            latency.add_metric([queue], gauges.latency[queue])
            paused.add_metric([queue], 1.0 if gauges.paused.get(queue) else 0.0)
        yield jobs
        yield latency
        yield paused
        yield GaugeMetricFamily(
            "eddyq_database_up",
            "1 if this scrape read the gauges from the database, 0 if the read failed.",
            value=1.0 if gauges.ok else 0.0,
        )
        yield GaugeMetricFamily(
            "eddyq_database_read_seconds",
            "How long this scrape's read of the database took, connection included.",
            value=gauges.seconds,
        )


# Exposition.


def registry(using: str | None = None) -> CollectorRegistry:
    """What ``/metrics`` shows: the counters of this process, or of every process sharing the
    multiprocess directory when there is one, and the database's gauges."""
    require()
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    exposed = CollectorRegistry(auto_describe=False)
    directory = multiprocess_directory()
    if directory is not None:
        MultiProcessCollector(exposed, path=directory)  # type: ignore[no-untyped-call]
    elif _instruments is not None:
        for collector in _instruments.collectors():
            exposed.register(collector)
    exposed.register(DatabaseCollector(using))
    return exposed


@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    """``/metrics`` for Prometheus, wherever you route it: the database's gauges and this
    process's counters (every process's with ``PROMETHEUS_MULTIPROC_DIR``)."""
    from prometheus_client.exposition import choose_encoder

    exposed = registry()
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(exposed), content_type=content_type)


@dataclass(frozen=True)
class Server:
    """A ``/metrics`` HTTP server running on a thread of this process."""

    address: str
    port: int
    _server: Any

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(port: int, address: str = "0.0.0.0") -> Server:
    """Serve ``registry()`` over HTTP on ``address``:``port`` (0: any free port), on a daemon
    thread. A process forked later closes its copy of the listening socket."""
    require()
    from prometheus_client import start_http_server

    server, _thread = cast(Any, start_http_server(port, addr=address, registry=registry()))
    os.register_at_fork(after_in_child=server.socket.close)
    return Server(address, server.server_port, server)


def start_for_worker(port: int | None, address: str, processes: int) -> Server | None:
    """What ``eddyq_worker`` does before it starts its workers: count, and serve ``/metrics`` on
    ``port`` when given, combining its processes' counters under ``processes`` > 1."""
    require()
    if port is not None and processes > 1 and multiprocess_directory() is None:
        use_multiprocess_directory()
    enable()
    return None if port is None else serve(port, address)
