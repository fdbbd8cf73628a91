"""Workflows: the graph as stored, release, results, failure and resume, dynamic steps,
cancellation and retention, run in this process (``run_jobs``) against the real database."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from demo.models import Execution
from django_eddyq import Workflow, chain, group
from django_eddyq.exceptions import InvalidWorkflow
from django_eddyq.maintenance import Cleaner
from django_eddyq.models import Job, WorkflowEdge, WorkflowRun, WorkflowStep
from django_eddyq.testing import run_jobs
from django_eddyq.workflows import WorkflowContext
from tests import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def states(workflow: Workflow) -> dict[str, str]:
    by_id = dict(
        Job.all_objects.filter(pk__in=[step.job_id for step in workflow.steps]).values_list(
            "id", "state"
        )
    )
    return {step.name: by_id.get(step.job_id, "deleted") for step in workflow.steps}


def result(workflow: Workflow, name: str) -> Any:
    [step] = [step for step in workflow.steps if step.name == name]
    return Job.all_objects.get(pk=step.job_id).result


def run_all() -> None:
    """Runs jobs until none is due: each call runs the steps released by the previous one."""
    for _ in range(50):
        if not run_jobs():
            return
    raise AssertionError("jobs kept coming")


def test_steps_wait_for_their_dependencies_and_read_their_results() -> None:
    workflow = Workflow("import", retention="1h")
    fetch = workflow.add(jobs.workflow_step.s("fetch"), name="fetch")
    parts = [
        workflow.add(jobs.workflow_step.s(f"part-{n}"), after=[fetch], name=f"part-{n}")
        for n in range(3)
    ]
    workflow.add(jobs.workflow_step.s("finish"), after=parts, name="finish")
    assert workflow.enqueue() is workflow
    assert states(workflow) == {
        "fetch": "available",
        "part-0": "pending",
        "part-1": "pending",
        "part-2": "pending",
        "finish": "pending",
    }
    assert WorkflowEdge.objects.count() == 6
    # A burst of rounds: each round runs the steps the previous one released.
    run_jobs()
    assert set(states(workflow).values()) == {"completed"}
    assert sorted(result(workflow, "finish")["inputs"]) == ["part-0", "part-1", "part-2"]
    assert result(workflow, "part-1")["inputs"]["fetch"]["label"] == "fetch"
    run = WorkflowRun.objects.get(pk=workflow.id)
    assert (run.state, run.unfinished, run.failed) == ("completed", 0, 0)
    assert run.finalized_at is not None


def test_a_workflow_is_stored_in_the_callers_transaction() -> None:
    with transaction.atomic():
        chain(jobs.workflow_step.s("a"), jobs.workflow_step.s("b")).enqueue()
        assert Job.objects.count() == 2
        transaction.set_rollback(True)
    assert not Job.objects.exists() and not WorkflowRun.objects.exists()


def test_shorthands() -> None:
    linear = chain(*(jobs.workflow_step.s(f"c{n}") for n in range(3))).enqueue()
    assert [step.name for step in linear.steps] == [
        "workflow_step",
        "workflow_step-2",
        "workflow_step-3",
    ]
    fanned = group(jobs.workflow_step.s("g1"), jobs.workflow_step.s("g2")).then(
        jobs.workflow_step.s("after")
    )
    fanned.enqueue()
    run_all()
    assert set(states(linear).values()) == set(states(fanned).values()) == {"completed"}
    labels = list(Execution.objects.values_list("label", flat=True))
    assert labels.index("c0") < labels.index("c1") < labels.index("c2")
    assert labels.index("after") > max(labels.index("g1"), labels.index("g2"))


def test_invalid_graphs_are_refused_and_nothing_is_stored() -> None:
    first, other = Workflow("first"), Workflow("other")
    a = first.add(jobs.workflow_step.s("a"))
    with pytest.raises(InvalidWorkflow, match="step 'workflow_step' is a step of workflow"):
        other.add(jobs.workflow_step.s("b"), after=[a])
    with pytest.raises(InvalidWorkflow, match="has no step 'nope'"):
        first.add(jobs.workflow_step.s("b"), after=["nope"])
    first.add(jobs.workflow_step.s("b"), name="x")
    with pytest.raises(InvalidWorkflow, match="already has a step 'x'"):
        first.add(jobs.workflow_step.s("c"), name="x")
    cyclic = Workflow("cyclic")
    b = cyclic.add(jobs.workflow_step.s("b"), name="b")
    c = cyclic.add(jobs.workflow_step.s("c"), after=[b], name="c")
    cyclic.after(b, c)
    with pytest.raises(InvalidWorkflow, match="has a cycle among: b, c"):
        cyclic.enqueue()
    with pytest.raises(InvalidWorkflow, match="a step is a task's signature"):
        first.add(jobs.workflow_step)  # type: ignore[arg-type]
    assert not Job.objects.exists() and not WorkflowRun.objects.exists()
    with pytest.raises(ValueError, match="cannot be a workflow step"):
        jobs.workflow_step.using(unique_key="k").s("x")


def test_a_failed_step_cancels_its_dependents_and_a_retry_resumes_from_there() -> None:
    workflow = Workflow("resume")
    fetch = workflow.add(jobs.workflow_step.s("fetch"), name="fetch")
    broken = workflow.add(
        jobs.workflow_step.using(max_attempts=1).s("broken", fail=True), after=[fetch], name="b"
    )
    tolerant = workflow.add(
        jobs.workflow_step.s("tolerant"), after=[broken], ignore_failure=True, name="tolerant"
    )
    after = workflow.add(jobs.workflow_step.s("after"), after=[broken], name="after")
    workflow.add(jobs.workflow_step.s("last"), after=[after, tolerant], name="last")
    workflow.enqueue()
    run_all()
    assert states(workflow) == {
        "fetch": "completed",
        "b": "failed",
        "tolerant": "completed",
        "after": "cancelled",
        "last": "cancelled",
    }
    cancelled = Job.objects.get(pk=after.job_id)
    assert cancelled.errors[-1]["error"] == (
        f"DependencyFailed: step b (job {broken.job_id}) ended failed"
    )
    run = WorkflowRun.objects.get(pk=workflow.id)
    assert (run.state, run.unfinished, run.failed) == ("failed", 0, 3)

    # Retried (it would now succeed), the failed step brings back the steps it cancelled.
    Job.objects.filter(pk=broken.job_id).update(kwargs={"fail": False})
    assert Job.objects.get(pk=broken.job_id).retry()
    assert states(workflow)["after"] == states(workflow)["last"] == "pending"
    run.refresh_from_db()
    assert (run.state, run.unfinished, run.failed, run.finalized_at) == ("running", 3, 0, None)
    run_all()
    assert set(states(workflow).values()) == {"completed"}
    # The tolerant step ran once, after the failure; it did not run again.
    assert Execution.objects.filter(label="tolerant").count() == 1
    run.refresh_from_db()
    assert run.state == "completed"


def test_retrying_a_step_cancelled_because_of_another_keeps_it_waiting() -> None:
    workflow = chain(
        jobs.workflow_step.using(max_attempts=1).s("a", fail=True),
        jobs.workflow_step.s("b"),
        jobs.workflow_step.s("c"),
    ).enqueue()
    run_all()
    a, b, c = workflow.steps
    assert states(workflow) == {a.name: "failed", b.name: "cancelled", c.name: "cancelled"}
    # b depends on a, which still failed: it is cancelled again at once, naming a.
    Job.objects.get(pk=b.job_id).retry()
    assert states(workflow) == {a.name: "failed", b.name: "cancelled", c.name: "cancelled"}
    assert WorkflowStep.objects.get(job_id=b.job_id).cancelled_by == a.job_id
    assert WorkflowRun.objects.get(pk=workflow.id).unfinished == 0


def test_cancelling_a_workflow_cancels_its_unfinished_steps() -> None:
    workflow = chain(jobs.workflow_step.s("a"), jobs.workflow_step.s("b")).enqueue()
    run = WorkflowRun.objects.get(pk=workflow.id)
    assert run.cancel() == 2
    assert set(states(workflow).values()) == {"cancelled"}
    assert (run.state, run.unfinished) == ("cancelled", 0)
    assert not run_jobs()
    assert run.retry_failed() == 2  # both were cancelled by hand; the second waits again
    run_all()
    assert set(states(workflow).values()) == {"completed"}


def test_a_running_step_adds_steps_to_its_own_workflow() -> None:
    workflow = Workflow("dynamic")
    spread = workflow.add(jobs.fan_out.s(4), name="spread")
    workflow.add(jobs.workflow_step.s("end"), after=[spread], name="end")
    workflow.enqueue()
    run_all()
    steps = dict(WorkflowStep.objects.filter(workflow_id=workflow.id).values_list("name", "job_id"))
    assert sorted(steps) == ["end", "gather", "part-0", "part-1", "part-2", "part-3", "spread"]
    gather = Job.objects.get(pk=steps["gather"])
    assert gather.state == "completed"
    assert sorted(gather.result["inputs"]) == ["part-0", "part-1", "part-2", "part-3"]
    for name in ("part-0", "part-3"):
        assert (
            Job.objects.get(pk=steps[name]).result["started"]
            >= Job.objects.get(pk=steps["spread"]).result
        )
    run = WorkflowRun.objects.get(pk=workflow.id)
    assert (run.steps, run.unfinished, run.state) == (7, 0, "completed")


def test_a_workflows_jobs_are_kept_until_it_ends_plus_its_retention() -> None:
    workflow = chain(jobs.workflow_step.s("a"), jobs.workflow_step.s("b"), retention="1h")
    workflow.enqueue()
    first = workflow.steps[0]
    run_jobs(ids=[first.job_id])
    # Long past any job retention, the first step is kept: the workflow has not ended.
    much_later = timezone.now() + timedelta(days=400)
    Cleaner().run_once(now=much_later)
    assert Job.objects.get(pk=first.job_id).state == "completed"
    run_all()
    run = WorkflowRun.objects.get(pk=workflow.id)
    assert run.state == "completed"
    ended = run.finalized_at
    Cleaner().run_once(now=ended + timedelta(minutes=59))
    assert Job.all_objects.filter(pk__in=[s.job_id for s in workflow.steps]).count() == 2
    assert WorkflowRun.objects.filter(pk=workflow.id).exists()
    Cleaner().run_once(now=ended + timedelta(hours=1, seconds=1))
    assert not Job.all_objects.filter(pk__in=[s.job_id for s in workflow.steps]).exists()
    assert not WorkflowRun.objects.filter(pk=workflow.id).exists()
    assert not WorkflowStep.objects.exists() and not WorkflowEdge.objects.exists()


def test_a_plain_job_is_no_step() -> None:
    job = jobs.add.enqueue(1, 2)
    run_jobs()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM eddyq_workflow_steps")
        assert cursor.fetchone() == (0,)
    assert Job.objects.get(pk=job.pk).state == "completed"


def test_a_step_of_a_task_limited_per_key_keeps_its_key() -> None:
    """Its limits hold as a step as they do for its other jobs: the keyed claim takes it."""
    workflow = Workflow("keyed")
    first = workflow.add(jobs.one_per_customer.s(0.0, "acme"))
    workflow.add(jobs.one_per_customer.s(0.0, "acme"), after=[first])
    workflow.enqueue()
    keys = Job.objects.filter(task=jobs.one_per_customer.path).values_list("limit_key", flat=True)
    assert list(keys) == ["acme", "acme"]
    run_all()
    assert set(states(workflow).values()) == {"completed"}


def test_a_step_is_known_by_its_row_not_by_its_jobs_metadata() -> None:
    """A row writer who points a job's metadata at another workflow reads none of its results:
    the workflow and step a handler sees are its step row's, found by the job's id."""
    secret = Workflow("secret")
    secret.add(jobs.workflow_step.s("secret"), name="secret")
    secret.enqueue()
    run_all()
    mine = Workflow("mine")
    probe = mine.add(jobs.workflow_probe.s("secret"), name="probe")
    mine.enqueue()
    plain = jobs.workflow_probe.enqueue("secret")
    forged = {"workflow": secret.id, "workflow_step": "secret"}
    Job.objects.filter(pk__in=[probe.job_id, plain.pk]).update(metadata=forged)
    run_all()
    assert Job.objects.get(pk=plain.pk).result == {"workflow": None}
    assert Job.objects.get(pk=probe.job_id).result == {
        "workflow": mine.id,
        "step": "probe",
        "read": f"workflow {mine.id} has no step 'secret'",
    }


def test_an_ended_workflow_takes_no_more_steps() -> None:
    workflow = chain(jobs.workflow_step.s("a"), retention=None).enqueue()
    run_all()
    [step] = workflow.steps
    assert step.job_id is not None and workflow.id is not None
    late = WorkflowContext(workflow.id, step.name, step.job_id)
    late.add(jobs.workflow_step.s("late"), after=[step.name])
    with pytest.raises(InvalidWorkflow, match="has ended: it takes no more steps"):
        late.enqueue()
    assert Job.objects.count() == 1
    assert WorkflowRun.objects.get(pk=workflow.id).steps == 1
