"""The job table's indexes and the plans of the worker's hot statements (docs/performance.md).

Every update of a job changes its state, which the partial indexes' predicates name, so none is a
HOT update: each claim and finish writes an entry into every index whose predicate the new row
version meets. Plans are read with the statistics a busy table has: thousands of available jobs,
and ``eddyq_queues`` analyzed while it holds their queue.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from django_eddyq import enqueue, sql
from django_eddyq.db import numbered_parameters
from django_eddyq.worker import passes
from django_eddyq.worker.pacing import claim_limit
from django_eddyq.worker.passes import Pass, run_pass
from tests import jobs
from tests.factories import BatchFactory, JobFactory

pytestmark = pytest.mark.django_db

AVAILABLE_JOBS = 5000


def plan(statement: str, params: dict[str, Any]) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (COSTS OFF) " + statement, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def reads_jobs_by_primary_key(statement_plan: str) -> bool:
    """Whether the plan finds the jobs it updates through the primary key (an index scan or a
    bitmap scan, as the planner sees fit), never by reading the whole table."""
    return "eddyq_jobs_pkey" in statement_plan and "Seq Scan on eddyq_jobs" not in statement_plan


def claim_params(queues: list[str] | None) -> dict[str, Any]:
    return {"queues": queues, "worker_id": "test", "lease_seconds": 60.0}


@pytest.fixture
def busy_queue() -> None:
    """Thousands of available jobs, a hundred each in a paused queue and in a rare one, all
    analyzed."""
    specs = [enqueue.JobSpec.for_task(jobs.add, (1, 2), {}) for _ in range(AVAILABLE_JOBS)]
    for queue in ("paused", "rare"):
        specs += [
            enqueue.JobSpec.for_task(jobs.add.using(queue=queue), (1, 2), {}) for _ in range(100)
        ]
    enqueue.insert_jobs(specs)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE eddyq_queues SET paused_at = now() WHERE name = 'paused'")
        cursor.execute("ANALYZE eddyq_jobs")
        cursor.execute("ANALYZE eddyq_queues")


def test_only_the_primary_key_holds_every_job() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT index_class.relname FROM pg_index AS ix
            JOIN pg_class AS index_class ON index_class.oid = ix.indexrelid
            WHERE ix.indrelid = 'eddyq_jobs'::regclass AND ix.indpred IS NULL
            ORDER BY 1
            """
        )
        full_indexes = [name for (name,) in cursor.fetchall()]
    assert full_indexes == ["eddyq_jobs_pkey"]


def test_the_jobs_of_a_batch_are_found_by_the_partial_batch_index() -> None:
    batch = BatchFactory()
    JobFactory.create_batch(3, batch=batch)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
    assert "eddyq_jobs_batch_idx" in plan(
        "SELECT id FROM eddyq_jobs WHERE batch_id = %(batch)s", {"batch": batch.pk}
    )


@pytest.mark.usefixtures("busy_queue")
@pytest.mark.parametrize("queues", [None, ["default", "paused"]])
def test_the_claim_reads_its_index_in_order_past_paused_queues(queues: list[str] | None) -> None:
    """Paused queues are a filter on the ordered index scan, never an anti-join that reads and
    sorts every available job (which is what NOT EXISTS became, once eddyq_queues was analyzed)."""
    claim_plan = plan(sql.claim_statement(40, queues), claim_params(queues))
    assert "Index Scan using eddyq_jobs_claim_idx on eddyq_jobs" in claim_plan
    assert "Sort" not in claim_plan
    assert "Anti Join" not in claim_plan


@pytest.mark.usefixtures("busy_queue")
def test_a_worker_of_a_rare_queue_finds_its_jobs_by_the_queue_index() -> None:
    claim_plan = plan(sql.claim_statement(40, ["rare"]), claim_params(["rare"]))
    assert "Index Scan on eddyq_jobs_queue_claim_idx" in claim_plan or (
        "Index Scan using eddyq_jobs_queue_claim_idx" in claim_plan
    )


@pytest.mark.usefixtures("busy_queue")
@pytest.mark.parametrize("queues", [None, ["default"]])
def test_the_claim_updates_the_jobs_it_picked_by_primary_key(queues: list[str] | None) -> None:
    """Joined to the picked ids, the update was planned on a table this size as a hash join over
    a scan of every row."""
    claim_plan = plan(sql.claim_statement(40, queues), claim_params(queues))
    assert reads_jobs_by_primary_key(claim_plan)


@pytest.mark.usefixtures("busy_queue")
def test_the_finish_looks_its_jobs_up_by_primary_key() -> None:
    """The statistics say no job runs, as they do in a drain: joined to the outcomes alone, the
    finish was planned as a scan of every row, each compared with every outcome."""
    with connection.cursor() as cursor:
        cursor.execute(sql.claim_statement(50, None), claim_params(None))
        claimed = [row[0] for row in cursor.fetchall()]
    outcomes = [{"id": job_id, "attempt": 1, "state": "completed"} for job_id in claimed]
    finish_plan = plan(sql.FINISH_JOBS, {"worker_id": "test", "outcomes": json.dumps(outcomes)})
    assert reads_jobs_by_primary_key(finish_plan)


@pytest.mark.usefixtures("busy_queue")
def test_promoting_due_jobs_updates_them_by_primary_key() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE eddyq_jobs SET state = 'scheduled', run_at = now() - interval '1 second'"
            " WHERE id IN (SELECT id FROM eddyq_jobs ORDER BY id LIMIT 1000)"
        )
        cursor.execute("ANALYZE eddyq_jobs")
    promote_plan = plan(sql.PROMOTE_DUE_ANY_QUEUE, {"now": None, "limit": 1000})
    assert reads_jobs_by_primary_key(promote_plan)


@pytest.fixture
def no_statistics() -> None:
    """Thousands of available jobs in a table PostgreSQL has no statistics for: as a new one
    is, or one just truncated or restored, until autovacuum's first ANALYZE."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE eddyq_jobs")
    specs = [enqueue.JobSpec.for_task(jobs.add, (1, 2), {}) for _ in range(AVAILABLE_JOBS)]
    enqueue.insert_jobs(specs)


@pytest.mark.usefixtures("no_statistics")
def test_a_claim_from_any_queue_is_an_ordered_index_scan_without_statistics() -> None:
    statement = sql.claim_statement(40, None)
    # On its own, the planner may read every available job and sort them (it did, on this
    # table before it gained a column: its choice follows the table's width). The worker sends
    # CLAIM_WITHOUT_SORT first (see the test below), which rules the sort out whatever it
    # estimates.
    with connection.cursor() as cursor:
        cursor.execute(sql.CLAIM_WITHOUT_SORT)
    claim_plan = plan(statement, claim_params(None))
    assert "Index Scan using eddyq_jobs_claim_idx on eddyq_jobs\n" in claim_plan
    assert "Sort" not in claim_plan


@pytest.mark.usefixtures("no_statistics")
def test_a_claim_from_one_queue_reads_the_queue_index_in_order_without_statistics() -> None:
    """The queue is an equality, which the queue index answers in claim order (as ``= ANY`` of
    one queue, the planner read and sorted that queue's jobs)."""
    claim_plan = plan(sql.claim_statement(40, ["default"]), claim_params(["default"]))
    assert "Index Scan using eddyq_jobs_queue_claim_idx on eddyq_jobs\n" in claim_plan
    assert "Sort" not in claim_plan


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("queues", "without_sort"), [(None, True), (["default"], False), (["default", "rare"], False)]
)
def test_a_pass_claims_from_any_queue_without_a_sort(
    queues: list[str] | None, without_sort: bool, tmp_path: Path
) -> None:
    enqueue.insert_jobs([enqueue.JobSpec.for_task(jobs.add, (1, 2), {})])
    trace = tmp_path / "libpq.trace"
    with passes.connect() as worker_connection, trace.open("w") as out:
        # What the pass sends, as libpq writes it out.
        worker_connection.pgconn.trace(out.fileno())
        done = run_pass(
            worker_connection,
            Pass(outcomes=[], renew=[], promote=False, claim=5, touch=[]),
            worker_id="test",
            lease_seconds=60.0,
            queues=queues,
        )
        worker_connection.pgconn.untrace()
    sent = trace.read_text()
    assert len(done.claimed) == 1
    assert (sql.CLAIM_WITHOUT_SORT in sent) is without_sort
    if without_sort:
        assert sent.index(sql.CLAIM_WITHOUT_SORT) < sent.index("FOR UPDATE SKIP LOCKED")


@pytest.mark.django_db(transaction=True)
def test_a_claim_from_any_queue_makes_the_server_warn_of_nothing() -> None:
    """SET LOCAL outside BEGIN, as a pipeline's statements are, has the server log "SET LOCAL
    can only be used in transaction blocks" at every pass; it sends the client that WARNING
    too, which is what this test hears."""
    enqueue.insert_jobs([enqueue.JobSpec.for_task(jobs.add, (1, 2), {})])
    notices: list[str] = []
    with passes.connect() as worker_connection:
        worker_connection.add_notice_handler(lambda notice: notices.append(notice.message_primary))
        done = run_pass(
            worker_connection,
            Pass(outcomes=[], renew=[], promote=False, claim=5, touch=[]),
            worker_id="test",
            lease_seconds=60.0,
            queues=None,
        )
    assert len(done.claimed) == 1
    assert notices == []


@pytest.mark.usefixtures("busy_queue")
def test_a_prepared_claim_settles_on_a_generic_plan() -> None:
    """Planned once, not at every pass: its generic plan costs what a custom one does."""
    statement = sql.claim_statement(40, None)
    raw_connection = connection.connection
    # Django's connection prepares nothing (prepare_threshold None, client-side binding
    # cursors); the worker's does.
    raw_connection.prepare_threshold = 0
    try:
        with psycopg.Cursor(raw_connection) as cursor:
            for _ in range(8):
                cursor.execute(statement, claim_params(None))
                assert len(cursor.fetchall()) == 40
            # Prepared as psycopg sends it: with $n placeholders.
            cursor.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%FOR UPDATE SKIP LOCKED%' AND statement LIKE '%LIMIT 40%'",
                prepare=False,
            )
            plans = cursor.fetchall()
    finally:
        raw_connection.prepare_threshold = None
    assert plans, "the claim was not prepared"
    [(generic_plans, custom_plans)] = plans
    assert generic_plans >= 2, (generic_plans, custom_plans)


@pytest.mark.parametrize("room", range(1, 200))
def test_the_claim_limit_takes_most_of_the_room(room: int) -> None:
    assert room * 7 / 8 < claim_limit(room) <= room


def test_the_claim_limit_has_few_distinct_values() -> None:
    assert len({claim_limit(room) for room in range(1, 1001)}) < 70


def test_the_job_ids_come_from_the_sequence_large_enqueues_reserve_from() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence('eddyq_jobs', 'id')::regclass::text")
        (sequence,) = cursor.fetchone()
    assert f"nextval('{sequence}')" in sql.RESERVE_JOB_IDS


# Workflows: what a pass that ends steps sends after its finish (steps.settle_ended).


def keyed_plan(statement: str, params: dict[str, Any]) -> str:
    """The plan of ``statement`` with sequential scans off: what is read by key at any size is
    read so here, on small tables."""
    raw_connection = connection.connection
    with psycopg.Cursor(raw_connection) as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute("EXPLAIN (COSTS OFF) " + statement, params)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")


@pytest.fixture
def chains_half_done() -> list[int]:
    """Two hundred chains of three steps analyzed before any ended; then the first step of
    each completed (as a burst of completions leaves the statistics behind). Their ids."""
    from django_eddyq import chain

    workflows = [chain(*(jobs.workflow_step.s(str(n)) for n in range(3))) for _ in range(200)]
    for workflow in workflows:
        workflow.enqueue()
    with connection.cursor() as cursor:
        for table in ("eddyq_jobs", "eddyq_workflows", "eddyq_workflow_steps"):
            cursor.execute(f"ANALYZE {table}")
        first = [workflow.steps[0].job_id for workflow in workflows]
        cursor.execute(
            "UPDATE eddyq_jobs SET state = 'completed', finalized_at = now() WHERE id = ANY(%s)",
            [first],
        )
    return [workflow.id for workflow in workflows if workflow.id is not None]


def test_ending_steps_reads_each_job_by_its_id(chains_half_done: list[int]) -> None:
    from django_eddyq.models import WorkflowStep

    ids = list(
        WorkflowStep.objects.filter(name="workflow_step").values_list("job_id", flat=True)[:10]
    )
    found = keyed_plan(sql.END_STEPS, {"ids": ids})
    assert "Index Cond: (id = locked.job_id)" in found, found
    assert "eddyq_jobs_finalized_idx" not in found, found


def generic_plan(statement: str, params: dict[str, Any]) -> str:
    """The plan of ``statement`` as a worker runs it once prepared: generic (arrays of unknown
    length), run with ANALYZE, so that its rows say what each step read."""
    numbered, names = numbered_parameters(statement)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE generic AS {numbered}")
        try:
            cursor.execute(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE generic"
                f"({', '.join(['%s'] * len(names))})",
                [params[name] for name in names],
            )
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE generic")


def test_counting_ended_steps_reads_each_workflow_by_its_id(chains_half_done: list[int]) -> None:
    ten = chains_half_done[:10]
    found = keyed_plan(
        sql.WORKFLOW_PROGRESS, {"workflow_ids": ten, "finished": [1] * 10, "failed": [0] * 10}
    )
    assert "Index Cond: (id = ANY (" in found, found
    assert "Index Cond: (id = locked.id)" in found, found


def test_counting_ended_steps_matches_each_workflow_once(chains_half_done: list[int]) -> None:
    """A pass's changes were matched against its locked workflows as a nested loop, each with
    every other, however many the pass ended."""
    found = generic_plan(
        sql.WORKFLOW_PROGRESS,
        {"workflow_ids": chains_half_done, "finished": [1] * 200, "failed": [0] * 200},
    )
    assert "Rows Removed by Join Filter" not in found, found


def test_releasing_dependents_reads_edges_and_steps_by_key(chains_half_done: list[int]) -> None:
    from django_eddyq.models import WorkflowStep

    ids = list(
        WorkflowStep.objects.filter(name="workflow_step").values_list("job_id", flat=True)[:10]
    )
    found = keyed_plan(sql.RELEASE_DEPENDENTS, {"ids": ids, "completed": [True] * 10})
    assert "Index Cond: (upstream_id = ANY (" in found, found
    assert "Seq Scan" not in found, found
