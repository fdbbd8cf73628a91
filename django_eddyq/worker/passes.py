"""A pass of the worker's loop: the statements of one transaction, and what they returned.

The worker's main thread plans a pass from its bookkeeping and hands it to its database thread,
which runs it (one commit, one WAL flush, for all its statements) while the main thread starts
the jobs the previous pass claimed; the main thread then acts on what the pass committed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.types.string import TextLoader

from django_eddyq import db, sql
from django_eddyq.batches import complete_batches
from django_eddyq.worker.execution import ClaimedJob, Outcome, claimed_job, outcome_records

TERMINAL_STATES = frozenset({"completed", "failed", "cancelled"})
# How many due jobs a burst worker promotes per pass.
PROMOTE_BATCH = 1000


@dataclasses.dataclass(slots=True, eq=False)
class Pass:
    """What one pass sends; once run, what it got back."""

    outcomes: list[Outcome]
    renew: list[int]  # the jobs whose leases a heartbeat renews; empty: no heartbeat
    promote: bool  # a burst worker makes due jobs available first
    claim: int  # how many jobs to claim at most; 0: no claim
    touch: list[str]  # the queues whose rows to keep fresh for the queue cleaner

    written: set[int] = dataclasses.field(default_factory=set)  # outcomes stored
    renewed: list[tuple[int, bool]] = dataclasses.field(default_factory=list)  # (id, cancelled)
    claimed: list[ClaimedJob] = dataclasses.field(default_factory=list)
    changed: int = 0  # rows written: outcomes stored, jobs promoted and claimed

    @property
    def ended_batches(self) -> list[int]:
        return sorted(
            {
                outcome.job.batch_id
                for outcome in self.outcomes
                if outcome.job.batch_id is not None and outcome.state in TERMINAL_STATES
            }
        )

    def is_empty(self) -> bool:
        return not (self.outcomes or self.renew or self.claim or self.touch)


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
) -> Pass:
    """Run ``planned`` on ``connection`` in one transaction and fill in what it returned.

    The statements go out together, in pipeline mode: between two syncs they are one implicit
    transaction, so one round trip and one commit serve them all, and an error in any of them
    rolls all of them back.
    """
    ended_batches = planned.ended_batches
    finish = heartbeat = promote = claim = None
    with connection.pipeline():
        if planned.outcomes:
            finish = connection.execute(
                sql.FINISH_JOBS,
                {"worker_id": worker_id, "outcomes": outcome_records(planned.outcomes)},
            )
            if ended_batches:
                with connection.cursor() as cursor:
                    complete_batches(cursor, ended_batches)
        if planned.renew:
            heartbeat = connection.execute(
                sql.HEARTBEAT,
                {"ids": planned.renew, "worker_id": worker_id, "lease_seconds": lease_seconds},
            )
        if planned.promote:
            statement, params = (
                (sql.PROMOTE_DUE_FROM_QUEUES, {"queues": queues})
                if queues
                else (sql.PROMOTE_DUE_ANY_QUEUE, {})
            )
            promote = connection.execute(statement, {**params, "now": None, "limit": PROMOTE_BATCH})
        if planned.claim:
            if queues is None:
                connection.execute(sql.CLAIM_WITHOUT_SORT)
            claim = connection.execute(
                sql.claim_statement(planned.claim, queues),
                {"queues": queues, "worker_id": worker_id, "lease_seconds": lease_seconds},
            )
        if planned.touch:
            connection.execute(sql.TOUCH_QUEUES, {"queues": planned.touch})
    # Out of pipeline mode: synced, committed, every result in.
    if finish is not None:
        planned.written = {row[0] for row in finish.fetchall()}
        planned.changed += len(planned.written)
    if heartbeat is not None:
        planned.renewed = [(row[0], row[1]) for row in heartbeat.fetchall()]
    if promote is not None:
        planned.changed += int(promote.fetchall()[0][0])
    if claim is not None:
        planned.claimed = sorted(map(claimed_job, claim.fetchall()), key=_order)
        planned.changed += len(planned.claimed)
    return planned


def _order(job: ClaimedJob) -> tuple[int, float, int]:
    """The claim's order: the statement returns its rows in whatever order it updated them."""
    return (-job.priority, job.due, job.id)
