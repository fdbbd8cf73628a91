"""Tasks the tests enqueue; workers find them by path (``tests.jobs.<name>``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from demo.models import Execution
from django_eddyq import Discard, Snooze, cancel_requested, task


@task
def record(label: str, **extra: Any) -> str:
    """Writes one Execution row: the proof a handler ran, and how often."""
    Execution.objects.create(label=label, pid=os.getpid())
    return label


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task(queue="emails", priority=7, max_attempts=4)
def send_email(to: str) -> str:
    return to


@task(max_attempts=3, backoff=lambda attempt: timedelta(seconds=10 * attempt))
def always_fails(message: str) -> None:
    raise ValueError(message)


@task(max_attempts=5)
def default_backoff_fails() -> None:
    raise RuntimeError("boom")


@task
def snooze(seconds: float) -> None:
    raise Snooze(seconds)


@task
def discard(reason: str) -> None:
    raise Discard(reason)


@task(timeout="200ms", max_attempts=2)
def sleeps_past_timeout(seconds: float) -> str:
    time.sleep(seconds)
    return "late"


@task(timeout="200ms", max_attempts=2)
async def async_sleeps_past_timeout(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "late"


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task
def returns_object() -> object:
    return object()


@task
def sleep(seconds: float, label: str = "slept") -> str:
    time.sleep(seconds)
    Execution.objects.create(label=label, pid=os.getpid())
    return label


@task
def nap(seconds: float) -> float:
    """Sleeps and touches nothing, so that a handler outliving its test leaves no trace."""
    time.sleep(seconds)
    return seconds


@task
def breaks_its_transaction() -> str:
    from django.db import connection

    with connection.cursor() as cursor, contextlib.suppress(Exception):
        cursor.execute("SELECT * FROM no_such_table")
    return "survived"


def broken_backoff(attempt: int) -> float:
    raise ZeroDivisionError("the backoff itself is broken")


@task(backoff=broken_backoff)
def fails_with_broken_backoff() -> None:
    raise ValueError("first failure")


class Escape(BaseException):
    """Not an Exception: a handler can still raise it."""


@task
def raises_base_exception() -> None:
    raise Escape("out of the box")


@task
async def async_raises_base_exception() -> None:
    raise Escape("out of the loop")


@task
async def async_waits(seconds: float) -> None:
    await asyncio.sleep(seconds)


@task
async def async_shrugs_off_cancel() -> str:
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(60)
    return "finished my work"


@task(max_attempts=5)
def fails_when_cancelled() -> None:
    """Works in small steps, checking between them whether it was cancelled."""
    for _ in range(600):
        if cancel_requested():
            raise RuntimeError("stopped because cancelled")
        time.sleep(0.05)


def plain_function(x: int) -> int:
    return x * 2


@task(max_attempts=3, backoff=lambda attempt: 1e15)
def fails_with_a_huge_backoff() -> None:
    raise ValueError("first failure")


@task(max_attempts=3, backoff=lambda attempt: float("nan"))
def fails_with_a_nan_backoff() -> None:
    raise ValueError("first failure")


@task(max_attempts=3)
def snoozes_for(seconds: str) -> None:
    """Snoozes for ``float(seconds)``: ``"inf"``, ``"nan"`` and ``"1e300"`` included."""
    raise Snooze(float(seconds))


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


@task(max_attempts=1)
def raises_the_unstorable() -> None:
    """Raises an exception whose message cannot be shown, and one holding NUL."""
    raise _Unprintable() from ValueError("NUL \x00 and a lone surrogate \ud800")


@task(max_attempts=1)
def raises_with_nul() -> None:
    raise ValueError("NUL \x00 and a lone surrogate \ud800 in a message")


# Tasks of the fault suite (tests/faults/).


@task(backoff=lambda attempt: 0)
def record_execution(job_id: int, seconds: float = 0.0) -> int:
    """Sleeps, then writes one Execution row naming its job, in the handler's own transaction.

    The handlers' own record for the fault suite: one row per execution that got as far as
    committing. The fault suite passes each job its own id (set by hand before the enqueue
    commits). No back-off, so that a rescued job runs again as soon as the scheduler sees it.
    """
    from django.db import transaction

    time.sleep(seconds)
    with transaction.atomic():
        Execution.objects.create(label="execution", job_id=job_id, pid=os.getpid())
    return job_id


@task(backoff=lambda attempt: 0)
def record_start_then_execution(job_id: int, seconds: float = 0.0) -> int:
    """``record_execution``, with a row labelled "started" committed first: when the handler
    began, for tests of what a stop does to handlers that have started."""
    Execution.objects.create(label="started", job_id=job_id, pid=os.getpid())
    return record_execution.func(job_id, seconds)


@task(timeout="300ms", max_attempts=1)
def never_returns() -> None:
    """Blocks its thread for good: only its timeout ends the attempt."""
    import threading

    threading.Event().wait()


@task(max_attempts=1)
def exits_process(code: int, after: float = 0.0) -> None:
    """Takes its whole worker process down, as a C extension calling exit() would."""
    time.sleep(after)
    os._exit(code)


@task(max_attempts=1)
def segfaults(after: float = 0.0) -> None:
    """Reads address 0: SIGSEGV for its whole worker process."""
    import ctypes

    time.sleep(after)
    ctypes.string_at(0)


@task(max_attempts=1)
def leaves_its_transaction_broken() -> str:
    """Leaves its connection out of autocommit, in a transaction aborted by an error."""
    from django.db import DatabaseError, connection, transaction

    transaction.set_autocommit(False)
    with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table")
    return "left it broken"


@task(max_attempts=1)
def fails_inside_atomic() -> None:
    """Breaks the transaction of an atomic block, then carries on using it."""
    from django.db import DatabaseError, connection, transaction

    with transaction.atomic():
        with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")
        Execution.objects.create(label="inside a broken atomic", pid=os.getpid())


@task(max_attempts=1)
def kills_its_connection() -> None:
    """Has the server end its own connection."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


class Overlap:
    """How many handlers of the probes below run at once, and the most that ever did."""

    lock = threading.Lock()
    now = 0
    most = 0

    @classmethod
    @contextlib.contextmanager
    def counting(cls) -> Iterator[None]:
        with cls.lock:
            cls.now += 1
            cls.most = max(cls.most, cls.now)
        try:
            yield
        finally:
            with cls.lock:
                cls.now -= 1


@task
def overlap_probe(seconds: float) -> None:
    with Overlap.counting():
        time.sleep(seconds)


@task
async def async_overlap_probe(seconds: float) -> None:
    with Overlap.counting():
        await asyncio.sleep(seconds)


# What tasks of the test process received, by job id: for tests that run a worker in-process.
RECEIVED: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}


@task
def receives(job_id: int, *args: Any, **kwargs: Any) -> None:
    RECEIVED[job_id] = (args, kwargs)


# What current_job() said inside handlers, by job id.
CONTEXTS: dict[int, dict[str, Any]] = {}


def _record_context() -> int:
    from django_eddyq import current_job

    job = current_job()
    assert job is not None
    CONTEXTS[job.id] = {
        "task": job.task,
        "queue": job.queue,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "batch_id": job.batch_id,
        "metadata": dict(job.metadata),
        "enqueued_at": job.enqueued_at,
        "due_at": job.due_at,
    }
    return job.id


@task(max_attempts=2)
def knows_its_job() -> int:
    return _record_context()


@task
async def async_knows_its_job() -> int:
    await asyncio.sleep(0)
    return _record_context()


@task
def enqueues_one_more(n: int) -> int:
    add.enqueue(n, 1)
    return n


HOARD: list[bytes] = []


@task(max_attempts=1)
def hoards_memory(mib: int) -> int:
    """Keeps ``mib`` MiB of this process's memory, every page written, until it ends."""
    HOARD.append(b"x" * (mib * 1024 * 1024))
    return mib


@task(backoff=lambda attempt: 0)
def overlap(seconds: float) -> None:
    """Records its start and its end by the database's clock, each in a statement of its own
    (committed at once): the flow-control tests compute how many runs overlapped. No back-off,
    so that a rescued job runs again as soon as the scheduler sees it."""
    from django.db import connection

    from django_eddyq import current_job

    record = (
        "INSERT INTO demo_execution (label, job_id, pid, created_at)"
        " VALUES (%s, %s, %s, clock_timestamp())"
    )
    job = current_job()
    job_id = job.id if job else None
    with connection.cursor() as cursor:
        cursor.execute(record, ["start", job_id, os.getpid()])
        time.sleep(seconds)
        cursor.execute(record, ["end", job_id, os.getpid()])


def _customer(seconds: float, customer: str) -> str:
    return customer


@task(concurrency=1, key=_customer, backoff=lambda attempt: 0)
def one_per_customer(seconds: float, customer: str) -> None:
    """``overlap``, at most one running per customer on all workers."""
    overlap.func(seconds)


@task(concurrency=2, key=_customer, backoff=lambda attempt: 0)
def two_per_customer(seconds: float, customer: str) -> None:
    overlap.func(seconds)


@task(concurrency=3, key=_customer, backoff=lambda attempt: 0)
def three_per_customer(seconds: float, customer: str) -> None:
    overlap.func(seconds)


@task(rate="10/s", burst=2, key=lambda customer: customer)
def customer_rate(customer: str) -> None:
    """At most 10 a second per customer, 2 at once after a quiet spell."""


@task(concurrency=1)
def one_at_a_time(seconds: float) -> None:
    """Limited as a whole: one running on all workers."""
    overlap.func(seconds)


def _database_clock() -> float:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        (seconds,) = cursor.fetchone()
    return float(seconds)


@task(max_attempts=3)
def workflow_step(label: str, seconds: float = 0.0, fail: bool = False) -> dict[str, Any]:
    """A workflow's step: returns when it started and ended by the database's clock, and the
    results of the steps it depends on; writes one Execution row (its label, its job) in its
    own transaction. ``fail``: raises every attempt."""
    from django_eddyq import current_job, current_workflow

    started = _database_clock()
    time.sleep(seconds)
    if fail:
        raise RuntimeError(f"step {label} fails")
    workflow = current_workflow()
    inputs = workflow.results() if workflow is not None else {}
    job = current_job()
    Execution.objects.create(label=label, job_id=job.id if job else None, pid=os.getpid())
    return {"label": label, "started": started, "ended": _database_clock(), "inputs": inputs}


@task
def fan_out(count: int) -> int:
    """Adds ``count`` steps after itself to its workflow, and one after all of them."""
    from django_eddyq import current_workflow

    workflow = current_workflow()
    assert workflow is not None
    parts = [
        workflow.add(workflow_step.s(f"part-{n}"), after=[workflow.step], name=f"part-{n}")
        for n in range(count)
    ]
    workflow.add(workflow_step.s("gather"), after=parts, name="gather")
    workflow.enqueue()
    return count


# Atomic handlers (tests/test_atomic_handlers.py, tests/faults/test_atomic_handlers.py).


@task(backoff=lambda attempt: 0)
def records_then_pauses(job_id: int, seconds: float = 0.0) -> int:
    """Writes one Execution row naming its job (committed at once), then sleeps: a worker that
    dies or freezes while it sleeps leaves the row behind, and the job runs again."""
    Execution.objects.create(label="execution", job_id=job_id, pid=os.getpid())
    time.sleep(seconds)
    return job_id


@task(atomic=True, backoff=lambda attempt: 0)
def atomic_records_then_pauses(job_id: int, seconds: float = 0.0) -> int:
    """``records_then_pauses``, atomic: its row commits with the job's completion, or never."""
    return records_then_pauses.func(job_id, seconds)


class Gate:
    """Holds the atomic handler below, after its write, until a test opens it."""

    reached = threading.Event()
    opened = threading.Event()

    @classmethod
    def reset(cls) -> None:
        cls.reached.clear()
        cls.opened.clear()


@task(atomic=True, max_attempts=3)
def atomic_writes(label: str, then: str = "returns") -> str:
    """Writes an Execution row labelled ``label`` and asks for another, labelled with the job's
    state, once its transaction has committed; then ends as ``then`` says."""
    from django.db import DatabaseError, connection, transaction

    from django_eddyq import current_job
    from django_eddyq.models import Job

    job = current_job()
    assert job is not None
    Execution.objects.create(label=label, job_id=job.id, pid=os.getpid())
    transaction.on_commit(
        lambda: Execution.objects.create(
            label=f"on commit, the job was {Job.objects.get(pk=job.id).state}",
            job_id=job.id,
            pid=os.getpid(),
        )
    )
    if then == "raises":
        raise ValueError(label)
    if then == "snoozes":
        raise Snooze(60)
    if then == "discards":
        raise Discard(label)
    if then == "waits at the gate":
        Gate.reached.set()
        Gate.opened.wait(10)
    if then == "stops when cancelled":
        while not cancel_requested():
            time.sleep(0.01)
        raise RuntimeError("stopped because cancelled")
    if then == "breaks its transaction":
        with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")
    return label


@task
def workflow_probe(name: str) -> dict[str, Any]:
    """What ``current_workflow()`` tells a handler: its workflow and step, and the result of
    the step ``name`` of that workflow (or why there is none)."""
    from django_eddyq import current_workflow

    workflow = current_workflow()
    if workflow is None:
        return {"workflow": None}
    try:
        read: Any = workflow.result(name)
    except LookupError as error:
        read = str(error)
    return {"workflow": workflow.id, "step": workflow.step, "read": read}
