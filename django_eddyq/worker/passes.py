"""A pass of the worker's loop: the statements of one transaction, what they returned, and the
thread that runs them.

The worker's main thread plans a pass from its bookkeeping and hands it to its database thread
(``PassRunner``), which runs it (one commit, one WAL flush, for all its statements) while the
main thread starts the jobs the previous pass claimed; the main thread then acts on what the pass
committed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import psycopg
from psycopg.types.string import TextLoader

from django_eddyq import db, registry, sql
from django_eddyq.conf import eddyq_settings
from django_eddyq.db import NumberedStatement
from django_eddyq.limits import Limits
from django_eddyq.maintenance.scheduler import PROMOTE_BATCH
from django_eddyq.operations import complete_batches
from django_eddyq.steps import settle_ended
from django_eddyq.vocabulary import TERMINAL_STATES
from django_eddyq.worker.execution import ClaimedJob, Outcome, claimed_job, outcome_records

logger = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True, eq=False)
class Pass:
    """What one pass sends; once run, what it got back."""

    outcomes: list[Outcome]
    renew: list[int]  # the jobs whose leases a heartbeat renews; empty: no heartbeat
    promote: bool  # a burst worker makes due jobs available first
    claim: int  # how many jobs to claim at most; 0: no claim
    touch: list[str]  # the queues whose rows to keep fresh for the queue cleaner
    seen: dict[str, Any] | None = None  # the worker's row in the registry, when it is due

    read_limits: bool = False  # read which queues are limited (``sql.LIMITED_QUEUES``)
    sent_at: float = 0.0  # monotonic, set as it is sent

    written: set[int] = dataclasses.field(default_factory=set)  # outcomes stored (committed too)
    renewed: list[tuple[int, bool]] = dataclasses.field(default_factory=list)  # (id, cancelled)
    claimed: list[ClaimedJob] = dataclasses.field(default_factory=list)
    changed: int = 0  # rows written: outcomes stored, jobs promoted and claimed
    limited_queues: list[str] | None = None  # the queues with a limit, when read

    @property
    def ended_batches(self) -> list[int]:
        """The batches of the jobs this pass ends (an atomic job's transaction completed its
        batch already)."""
        return sorted(
            {
                outcome.job.batch_id
                for outcome in self.outcomes
                if outcome.job.batch_id is not None
                and outcome.state in TERMINAL_STATES
                and not outcome.committed
            }
        )

    @property
    def ended_steps(self) -> list[int]:
        """The jobs of workflow steps that this pass ends (``steps.settle_ended`` reads which
        really did: a step is known by the key its workflow wrote in its metadata)."""
        return [
            outcome.job.id
            for outcome in self.outcomes
            if "workflow" in outcome.job.metadata and outcome.state in TERMINAL_STATES
        ]

    def is_empty(self) -> bool:
        return not (self.outcomes or self.renew or self.claim or self.touch or self.seen)


def connect() -> psycopg.Connection[tuple[Any, ...]]:
    """The worker's own connection for its passes. It reads jsonb as text: the claim reads each
    row's JSON itself (``execution.claimed_job``), so that a row that cannot be read fails
    alone, after the claim has been read in full."""
    connection = db.connect()
    connection.adapters.register_loader("jsonb", TextLoader)
    return connection


def run_pass(
    connection: psycopg.Connection[tuple[Any, ...]],
    planned: Pass,
    *,
    worker_id: str,
    lease_seconds: float,
    queues: Sequence[str] | None,
    limited: Sequence[str] = (),
    keyed: KeyedTasks | None = None,
    others: bool = True,
) -> Pass:
    """Run ``planned`` on ``connection`` in one transaction and fill in what it returned.

    ``limited``: the worker's queues that have a limit, as last read; ``keyed``: the tasks
    limited per key whose jobs it looks for. While there are any, the claim is the limited one
    (``sql.limited_claim_statement``), after the limited queues' locks and those of the keys it
    takes from (``sql.lock_keys_statement``), and takes from the other queues too unless
    ``others`` is false.

    The statements go out together, in pipeline mode: between two syncs they are one implicit
    transaction, so one round trip and one commit serve them all, and an error in any of them
    rolls all of them back.

    The outcomes already ``committed`` (atomic jobs') count as written, and are not written
    again. The heartbeat goes before the finish: a pass then locks the rows of its running jobs
    before the batches its finish ends, in the order an atomic job's transaction locks its job
    and its batch, so that neither waits for the other while holding what the other needs.
    """
    ended_batches = planned.ended_batches
    finish = heartbeat = promote = claim = limits = None
    to_write = [outcome for outcome in planned.outcomes if not outcome.committed]
    with connection.pipeline():
        if planned.read_limits:
            limits = connection.execute(sql.LIMITED_QUEUES)
        if planned.renew:
            heartbeat = connection.execute(
                sql.HEARTBEAT,
                {"ids": planned.renew, "worker_id": worker_id, "lease_seconds": lease_seconds},
            )
        if to_write:
            finish = connection.execute(
                sql.FINISH_JOBS, {"worker_id": worker_id, "outcomes": outcome_records(to_write)}
            )
            if ended_batches:
                with connection.cursor() as cursor:
                    complete_batches(cursor, ended_batches)
        # An atomic job's own transaction committed its end, not its workflow's release:
        # settling is done here for every step that ended (a step is settled once).
        if ended_steps := planned.ended_steps:
            with connection.cursor() as cursor:
                settle_ended(cursor, ended_steps)
        if planned.promote:
            statement, params = (
                (sql.PROMOTE_DUE_FROM_QUEUES, {"queues": queues})
                if queues
                else (sql.PROMOTE_DUE_ANY_QUEUE, {})
            )
            promote = connection.execute(statement, {**params, "now": None, "limit": PROMOTE_BATCH})
        if planned.claim:
            claimer = {"queues": queues, "worker_id": worker_id, "lease_seconds": lease_seconds}
            if limited or keyed:
                if limited:
                    connection.execute(sql.LOCK_LIMITS, {"limited": list(limited)})
                if queues is None:
                    connection.execute(sql.LIMITED_CLAIM_WITHOUT_SORT)
                connection.execute(sql.LIMITED_CLAIM_GENERIC_PLANS)
                limited_claim: dict[str, Any] = {
                    **claimer,
                    "limit": planned.claim,
                    "limited": list(limited),
                }
                if keyed:
                    lock_keys, keyed_claim = _keyed_statements(
                        None if queues is None else tuple(queues), others
                    )
                    keyed_params = {**limited_claim, **keyed.params}
                    lock_keys.send(connection, keyed_params)
                    claim = keyed_claim.send(connection, keyed_params)
                else:
                    claim = connection.execute(
                        sql.limited_claim_statement(queues, others=others), limited_claim
                    )
            else:
                if queues is None:
                    connection.execute(sql.CLAIM_WITHOUT_SORT)
                claim = connection.execute(sql.claim_statement(planned.claim, queues), claimer)
        if planned.touch:
            connection.execute(sql.TOUCH_QUEUES, {"queues": planned.touch})
        if planned.seen:
            connection.execute(sql.WORKER_SEEN, planned.seen)
    # Out of pipeline mode: synced, committed, every result in.
    if limits is not None:
        planned.limited_queues = [row[0] for row in limits.fetchall()]
    if finish is not None:
        planned.written = {row[0] for row in finish.fetchall()}
        planned.changed += len(planned.written)
    if len(to_write) < len(planned.outcomes):
        planned.written.update(outcome.job.id for outcome in planned.outcomes if outcome.committed)
    if heartbeat is not None:
        planned.renewed = [(row[0], row[1]) for row in heartbeat.fetchall()]
    if promote is not None:
        planned.changed += int(promote.fetchall()[0][0])
    if claim is not None:
        planned.claimed = sorted(map(claimed_job, claim.fetchall()), key=_order)
        planned.changed += len(planned.claimed)
    return planned


@functools.cache
def _keyed_statements(
    queues: tuple[str, ...] | None, others: bool
) -> tuple[NumberedStatement, NumberedStatement]:
    """The locks of the keys and the keyed claim, as sent: several KB each, too long for
    psycopg to cache their conversion."""
    return (
        NumberedStatement.of(sql.lock_keys_statement(queues)),
        NumberedStatement.of(sql.limited_claim_statement(queues, others=others, keyed=True)),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class KeyedTasks:
    """The tasks limited per key, as the keyed claim is sent them."""

    paths: frozenset[str]
    queues: frozenset[str]  # the queues they declare, where their jobs go unless told otherwise
    params: dict[str, list[Any]]

    @classmethod
    def declared(cls) -> KeyedTasks | None:
        """The tasks of this process's registry limited per key; None if there are none."""
        declared = sorted(registry.limited_tasks().items())
        if not declared:
            return None
        limits = [task.handler.limits or Limits() for _path, task in declared]
        rates = [limit.rate for limit in limits]
        paths = [path for path, _task in declared]
        return cls(
            paths=frozenset(paths),
            queues=frozenset(
                # eddyq's Task names it queue, Django's queue_name.
                getattr(task.task, "queue", None)
                or getattr(task.task, "queue_name", None)
                or eddyq_settings.DEFAULT_QUEUE
                for _path, task in declared
            ),
            params={
                "keyed_tasks": paths,
                "key_concurrency": [limit.concurrency for limit in limits],
                "key_rate": [None if rate is None else rate.limit for rate in rates],
                "key_period": [None if rate is None else rate.period_seconds for rate in rates],
                "key_burst": [None if rate is None else rate.burst for rate in rates],
            },
        )


def _order(job: ClaimedJob) -> tuple[int, float, int]:
    """The claim's order: the statement returns its rows in whatever order it updated them."""
    return (-job.priority, job.due, job.id)


class PassRunner:
    """The worker's own connection, and the thread that runs the passes it is sent on it.

    One pass is in flight at most: the main thread sends it, and takes it back once it has
    ended (``ended``). With none in flight, the main thread may also run one itself (``run``).
    """

    def __init__(
        self, *, worker_id: str, queues: Sequence[str] | None, wake: Callable[[], None]
    ) -> None:
        self.worker_id = worker_id
        self.queues = queues
        self._wake = wake  # the worker's: a pass has ended
        self.connection: psycopg.Connection[tuple[Any, ...]] | None = None
        # Which of the worker's queues have a limit, as last read, and when (monotonic).
        self.limited: list[str] = []
        self._limits_read_at = -math.inf
        # Until when the limited claim leaves the other queues out: their part of it came back
        # short, and reading past a limited queue's backlog for nothing, at every claim and
        # under the queue's lock, would hold up every worker's claim of it.
        self._others_idle_until = -math.inf
        # The tasks limited per key (read from the registry at the first claim), and whether
        # the keyed claim is left out: its last one found nothing to take, and no job has been
        # announced since in a queue their jobs were seen in (nor a poll interval passed), so
        # that a worker declaring such tasks does not take their locks at every pass for
        # nothing.
        self._keyed: KeyedTasks | None = None
        self._keyed_idle = False
        self._keyed_queues: set[str] = set()
        self._sent: queue.SimpleQueue[tuple[Pass, Future[Pass]] | None] = queue.SimpleQueue()
        # The pass sent and not yet taken back, with its result.
        self.in_flight: tuple[Pass, Future[Pass]] | None = None

    def connect(self) -> None:
        """Open the connection; after it was lost, again, the broken one closed."""
        if self.connection is not None:
            self.connection.close()
        self.connection = connect()

    def start_thread(self) -> None:
        threading.Thread(target=self._thread, name="eddyq-database", daemon=True).start()

    def stop_thread(self) -> None:
        self._sent.put(None)

    def close(self) -> None:
        """Mark the worker stopped in the registry, and close the connection."""
        if self.connection is None:
            return
        try:
            self.connection.execute(sql.WORKER_STOPPED, {"id": self.worker_id})
        except psycopg.Error as error:
            logger.warning(
                "eddyq worker %s: could not mark itself stopped: %s", self.worker_id, error
            )
        self.connection.close()

    def send(self, planned: Pass, *, here: bool) -> None:
        """Run the pass on this thread (``here``), or hand it to the database thread."""
        result: Future[Pass] = Future()
        planned.sent_at = time.monotonic()
        self.in_flight = (planned, result)
        if here:
            self._run_into(planned, result)
        else:
            self._sent.put((planned, result))

    def ended(self) -> tuple[Pass, Future[Pass]] | None:
        """The pass in flight and its result, once it has ended; then none is in flight."""
        if self.in_flight is None or not self.in_flight[1].done():
            return None
        ended, self.in_flight = self.in_flight, None
        return ended

    def _thread(self) -> None:
        """Runs the passes the main thread sends, and wakes it when each has ended."""
        while (item := self._sent.get()) is not None:
            self._run_into(*item)
            self._wake()

    def _run_into(self, planned: Pass, result: Future[Pass]) -> None:
        try:
            result.set_result(self.run(planned))
        except BaseException as error:
            result.set_exception(error)

    def run(self, planned: Pass) -> Pass:
        assert self.connection is not None
        now = time.monotonic()
        if self._limits_read_at == -math.inf and planned.claim:
            # The first claim knows which queues are limited: a burst worker whose first
            # claim found nothing would stop there.
            self._limits_read(self.connection.execute(sql.LIMITED_QUEUES).fetchall(), at=now)
            self._keyed = KeyedTasks.declared()
            self._keyed_queues = set(self._keyed.queues) if self._keyed else set()
        # A limit set or lifted reaches the worker within a poll interval; the plain claim
        # leaves a limited queue alone from the moment its limit is committed.
        if now - self._limits_read_at >= eddyq_settings.POLL_INTERVAL.total_seconds():
            planned.read_limits = True
            self._keyed_idle = False
        limited = self.limited
        keyed = None if self._keyed_idle or not planned.claim else self._keyed
        others = now >= self._others_idle_until
        done = run_pass(
            self.connection,
            planned,
            worker_id=self.worker_id,
            lease_seconds=eddyq_settings.STALE_AFTER.total_seconds(),
            queues=self.queues,
            limited=limited,
            keyed=keyed,
            others=others,
        )
        if (limited or keyed) and others and len(done.claimed) < planned.claim:
            # The other queues gave less than the limited ones left them: they have no more.
            self._others_idle_until = now + eddyq_settings.POLL_INTERVAL.total_seconds()
        if keyed is not None:
            keyed_queues = {job.queue for job in done.claimed if job.task in keyed.paths}
            self._keyed_queues |= keyed_queues
            self._keyed_idle = not keyed_queues
        if done.limited_queues is not None:
            self._limits_read([(name,) for name in done.limited_queues], at=now)
        return done

    def jobs_notified(self, queue_name: str) -> None:
        """New jobs in ``queue_name``, or a limited job of it ended (any thread): if keyed jobs
        were seen there, the next claim looks for them again, and if the queue is not limited,
        the next limited claim takes from the other queues again."""
        if queue_name in self._keyed_queues:
            self._keyed_idle = False
        if queue_name not in self.limited:
            self._others_idle_until = -math.inf

    def _limits_read(self, rows: list[tuple[Any, ...]], *, at: float) -> None:
        self._limits_read_at = at
        self.limited = [name for (name,) in rows if self.queues is None or name in self.queues]

    def hand_back_strays(self, known: list[int]) -> None:
        """Jobs running under this worker's id that it does not know of (claimed by a pass
        whose reply never came) go back, their attempt given back."""
        assert self.connection is not None
        with self.connection.transaction():
            rows = self.connection.execute(
                sql.HAND_BACK_STRAYS, {"worker_id": self.worker_id, "known": known}
            ).fetchall()
            ended = {batch for _id, state, batch, _ in rows if batch and state != "available"}
            if ended:
                with self.connection.cursor() as cursor:
                    complete_batches(cursor, sorted(ended))
            cancelled = [job_id for job_id, state, _batch, _ in rows if state != "available"]
            if cancelled:
                with self.connection.cursor() as cursor:
                    settle_ended(cursor, cancelled)
        for job_id, state, _batch, _notified in rows:
            logger.warning(
                "eddyq worker %s: job %s was claimed by a pass whose reply was lost; %s",
                self.worker_id,
                job_id,
                "handed back" if state == "available" else "cancelled, as was asked",
            )
