"""Workflows run by real worker processes: random graphs (hypothesis) drained by four workers,
then a worker that runs a step and leads SIGKILLed mid-step. What happened is read from the
database: each step's start and end as its handler read the database's clock, its job's
finalized time, and every release of a pending job as a trigger recorded it in the releasing
transaction."""

from __future__ import annotations

import dataclasses
import random
import signal
from collections.abc import Iterator
from datetime import datetime

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from demo.models import Execution
from django_eddyq import Workflow
from django_eddyq.models import Job, WorkflowEdge, WorkflowRun, WorkflowStep
from tests import jobs
from tests.processes import StartWorker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

# A row per job that leaves 'pending' for a state a worker can claim, written by the transaction
# that moved it, at its clock: who released what, when, and how often.
RECORD_RELEASES = [
    """CREATE TABLE test_releases (
        job_id bigint NOT NULL, state text NOT NULL, at timestamptz NOT NULL
    )""",
    """CREATE FUNCTION test_record_release() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO test_releases VALUES (NEW.id, NEW.state, clock_timestamp());
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER test_record_release AFTER UPDATE OF state ON eddyq_jobs FOR EACH ROW
    WHEN (OLD.state = 'pending' AND NEW.state IN ('available', 'scheduled'))
    EXECUTE FUNCTION test_record_release()""",
]
FORGET_RELEASES = [
    "DROP TRIGGER IF EXISTS test_record_release ON eddyq_jobs",
    "DROP FUNCTION IF EXISTS test_record_release()",
    "DROP TABLE IF EXISTS test_releases",
]


@pytest.fixture
def releases() -> Iterator[None]:
    with connection.cursor() as cursor:
        for statement in RECORD_RELEASES:
            cursor.execute(statement)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for statement in FORGET_RELEASES:
                cursor.execute(statement)


def released() -> dict[int, list[datetime]]:
    """The times each job was released, by job id."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT job_id, at FROM test_releases ORDER BY at")
        times: dict[int, list[datetime]] = {}
        for job_id, at in cursor.fetchall():
            times.setdefault(job_id, []).append(at)
    return times


@dataclasses.dataclass(frozen=True)
class Shape:
    """A random graph: each step's dependencies (earlier steps), how long it runs, whether it
    fails (its one attempt) and whether it runs whatever its dependencies' end."""

    after: list[list[int]]
    seconds: list[float]
    fails: list[bool]
    ignores: list[bool]

    def expected(self) -> list[str]:
        """Each step's end: failed if it fails, cancelled if a dependency did not complete and
        it does not ignore that, else completed."""
        ends: list[str] = []
        for step, dependencies in enumerate(self.after):
            unmet = any(ends[dependency] != "completed" for dependency in dependencies)
            if unmet and not self.ignores[step]:
                ends.append("cancelled")
            else:
                ends.append("failed" if self.fails[step] else "completed")
        return ends


@st.composite
def shapes(draw: st.DrawFn, *, failures: bool) -> Shape:
    count = draw(st.integers(min_value=2, max_value=30))
    after = [
        sorted(draw(st.sets(st.integers(0, step - 1), max_size=min(step, 5)))) if step else []
        for step in range(count)
    ]
    seconds = draw(
        st.lists(st.sampled_from([0.0, 0.0, 0.01, 0.05]), min_size=count, max_size=count)
    )
    seldom = st.sampled_from([False, False, False, True]) if failures else st.just(False)
    fails = draw(st.lists(seldom, min_size=count, max_size=count))
    ignores = draw(st.lists(seldom, min_size=count, max_size=count))
    return Shape(after, seconds, fails, ignores)


def enqueue(shape: Shape) -> Workflow:
    workflow = Workflow("random", retention=None)
    steps = []
    for number, dependencies in enumerate(shape.after):
        signature = jobs.workflow_step.using(max_attempts=1 if shape.fails[number] else 3).s(
            f"s{number}", shape.seconds[number], fail=shape.fails[number]
        )
        steps.append(
            workflow.add(
                signature,
                after=[steps[dependency] for dependency in dependencies],
                ignore_failure=shape.ignores[number],
                name=f"s{number}",
            )
        )
    return workflow.enqueue()


def settled(workflow: Workflow) -> bool:
    return WorkflowRun.objects.filter(pk=workflow.id, finalized_at__isnull=False).exists()


def check(shape: Shape, workflow: Workflow, *, killed: frozenset[int] = frozenset()) -> None:
    """What the database recorded agrees with the graph: each step ended as expected; one that
    ran started after each of its dependencies had ended (their handlers' last clock reading and
    their jobs' end) and after its own release; every step with dependencies that ran was
    released exactly once, after they had all ended, and one cancelled never was; roots were
    never pending. ``killed``: steps whose first attempt may have been killed (run again)."""
    ids = [step.job_id for step in workflow.steps]
    found = {job.pk: job for job in Job.all_objects.filter(pk__in=ids)}
    rows = [found[job_id] for job_id in ids]
    expected = shape.expected()
    assert [job.state for job in rows] == expected
    runs: dict[int | None, int] = {}
    for job_id in Execution.objects.values_list("job_id", flat=True):
        runs[job_id] = runs.get(job_id, 0) + 1
    releases = released()
    for number, (job, end) in enumerate(zip(rows, expected, strict=True)):
        dependencies = [rows[dependency] for dependency in shape.after[number]]
        if end == "cancelled":
            assert job.attempt == 0 and job.pk not in runs and job.pk not in releases, number
            continue
        if number in killed:
            assert job.attempt >= 1 and runs.get(job.pk, 0) >= (end == "completed")
        else:
            assert job.attempt == 1, (number, job.attempt, job.errors)
            assert runs.get(job.pk, 0) == (end == "completed"), number
        if not dependencies:
            assert job.pk not in releases, number
            continue
        [release] = releases[job.pk]  # exactly once
        assert job.finalized_at is not None
        for dependency in dependencies:
            assert dependency.finalized_at is not None
            assert release >= dependency.finalized_at, (number, dependency.pk)
            if end == "completed":
                assert job.result["started"] >= dependency.finalized_at.timestamp(), number
                if dependency.state == "completed":
                    assert job.result["started"] >= dependency.result["ended"], number
        if end == "completed":
            assert job.result["started"] >= release.timestamp(), number
            assert sorted(job.result["inputs"]) == sorted(
                f"s{dependency}"
                for dependency in shape.after[number]
                if rows[dependency].state == "completed"
            )
    run = WorkflowRun.objects.get(pk=workflow.id)
    assert run.unfinished == 0
    assert run.state == ("completed" if set(expected) == {"completed"} else "failed")
    assert not WorkflowStep.objects.filter(workflow_id=workflow.id, ended_state__isnull=True)


def forget_everything() -> None:
    Execution.objects.all().delete()
    WorkflowEdge.objects.all().delete()
    WorkflowStep.objects.all().delete()
    WorkflowRun.objects.all().delete()
    Job.all_objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM test_releases")


@pytest.fixture
def start_workers(start_worker: StartWorker, releases: None) -> None:
    """Four worker processes of concurrency 10, for every example of a test."""
    for _ in range(4):
        start_worker("--concurrency", "10", "--no-maintenance")


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(shape=shapes(failures=False))
def test_four_workers_run_every_step_after_its_dependencies(
    start_workers: None, shape: Shape
) -> None:
    """A random graph on four worker processes: every step runs once, after all of its
    dependencies, each released once, by the transaction that ended its last dependency."""
    forget_everything()
    workflow = enqueue(shape)
    wait_for(lambda: settled(workflow), 30)
    check(shape, workflow)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(shape=shapes(failures=True))
def test_four_workers_cancel_what_a_failure_blocks(start_workers: None, shape: Shape) -> None:
    """With steps that fail and steps that ignore their dependencies' failures: every step ends
    as the graph says (the oracle ``Shape.expected``), and no cancelled step is ever released."""
    forget_everything()
    workflow = enqueue(shape)
    wait_for(lambda: settled(workflow), 30)
    check(shape, workflow)


# A worker killed mid-step, while it leads.

PROCESS_TIMINGS = {
    "EDDYQ_LEADER_LEASE": "2s",
    "EDDYQ_LEADER_RENEW_INTERVAL": "500ms",
    "EDDYQ_STALE_AFTER": "2s",
    "EDDYQ_HEARTBEAT_INTERVAL": "500ms",
    "EDDYQ_RESCUE_INTERVAL": "300ms",
    "EDDYQ_SCHEDULER_INTERVAL": "200ms",
}


def leader_pid() -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT leader_id FROM eddyq_leader WHERE name = 'default' AND expires_at > now()"
        )
        row = cursor.fetchone()
    return int(row[0].split(":")[1]) if row else None


def test_a_step_killed_with_its_leader_is_rescued_and_releases_its_dependents_once(
    start_worker: StartWorker, worker_environment: dict[str, str], releases: None
) -> None:
    """A random graph with a slow step in its middle: the one worker, which also leads, is
    SIGKILLed while it runs the slow step. Another takes over the lead, its rescuer retries the
    step, and the retry, not the killed attempt, releases the step's dependents, once; the
    graph ends as if nothing had happened."""
    worker_environment.update(PROCESS_TIMINGS)
    chooser = random.Random(20)
    count = 24
    slow = 8
    shape = Shape(
        after=[
            sorted(chooser.sample(range(step), min(step, chooser.randint(1, 3)))) if step else []
            for step in range(count)
        ],
        seconds=[2.0 if step == slow else chooser.choice([0.0, 0.02]) for step in range(count)],
        fails=[False] * count,
        ignores=[False] * count,
    )
    shape.after[slow + 1].append(slow)  # the slow step has dependents, whatever the draw
    doomed = start_worker("--concurrency", "4")
    wait_for(lambda: leader_pid() == doomed.pid, 20)
    workflow = enqueue(shape)
    slow_job = workflow.steps[slow].job_id
    wait_for(lambda: Job.objects.get(pk=slow_job).state == "running", 20)
    assert Job.objects.get(pk=slow_job).locked_by.split(":")[1] == str(doomed.pid)
    heir = start_worker("--concurrency", "10")
    for _ in range(2):
        start_worker("--concurrency", "10", "--no-maintenance")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(5)
    # Its jobs as it died (the lease, 2 s, keeps the rescuer off them for now).
    held = set(
        Job.objects.filter(state="running", locked_by__contains=f":{doomed.pid}:").values_list(
            "id", flat=True
        )
    )
    assert slow_job in held

    wait_for(lambda: settled(workflow), 45)
    assert leader_pid() == heir.pid
    killed = frozenset(number for number, step in enumerate(workflow.steps) if step.job_id in held)
    check(shape, workflow, killed=killed)
    rescued_ids = {
        job.pk
        for job in Job.objects.filter(pk__in=[step.job_id for step in workflow.steps])
        if job.errors and job.errors[0]["error"].startswith("JobRescued")
    }
    assert rescued_ids == held
    rescued = Job.objects.get(pk=slow_job)
    assert rescued.attempt == 2
    assert rescued.errors[0]["error"].startswith("JobRescued")
    # The step's dependents waited for its second attempt: their release came after it ended.
    [edge] = WorkflowEdge.objects.filter(
        upstream_id=slow_job, downstream_id=workflow.steps[slow + 1].job_id
    )
    [release] = released()[edge.downstream_id]
    assert release >= rescued.finalized_at
