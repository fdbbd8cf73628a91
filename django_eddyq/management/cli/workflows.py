"""``eddyq workflow ID``: a workflow's counts and its steps, each with its state, attempts,
duration and the steps it runs after; ``eddyq workflow retry ID`` retries its failed steps (the
steps they cancelled come back with them) and ``eddyq workflow cancel ID`` cancels its
unfinished steps. The same functions as the admin's workflow page (``WorkflowRun.retry_failed``,
``WorkflowRun.cancel``, ``inspection.workflow_steps``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TextIO

from django_eddyq import inspection
from django_eddyq.durations import format_duration
from django_eddyq.management.cli.output import NOTHING, OK, ago, cell, confirm, table, to_json
from django_eddyq.models import WorkflowEdge, WorkflowRun, WorkflowStep

#: What ``eddyq workflow ACTION ID`` may do.
ACTIONS = ("retry", "cancel")
#: The steps listed unless --limit says otherwise: as many as the admin's page shows.
DEFAULT_LIMIT = inspection.WORKFLOW_STEPS_SHOWN
#: The most steps listed at once.
MAX_LIMIT = 10_000


def _find(stderr: Any, workflow_id: int) -> WorkflowRun | None:
    run = WorkflowRun.objects.filter(pk=workflow_id).first()
    if run is None:
        stderr.write(f"No workflow {workflow_id} (never enqueued, or deleted by retention).")
    return run


def _title(run: WorkflowRun) -> str:
    return f"workflow {run.pk} ({run.name})"


def _dependencies(steps: list[inspection.StepRow]) -> dict[int, list[dict[str, Any]]]:
    """The steps each of ``steps`` runs after, by job id: every
    one of them, listed or not (two index reads, of their edges and of the names not listed)."""
    names = {step.job_id: step.name for step in steps}
    edges = list(
        WorkflowEdge.objects.filter(downstream_id__in=list(names))
        .order_by("upstream_id")
        .values_list("downstream_id", "upstream_id", "ignore_failure")
    )
    unlisted = {upstream for _down, upstream, _ignore in edges if upstream not in names}
    if unlisted:
        names.update(WorkflowStep.objects.filter(job_id__in=unlisted).values_list("job_id", "name"))
    after: dict[int, list[dict[str, Any]]] = {}
    for downstream, upstream, ignore_failure in edges:
        after.setdefault(downstream, []).append(
            {"step": names.get(upstream), "job_id": upstream, "ignore_failure": ignore_failure}
        )
    return after


def workflow_data(run: WorkflowRun, *, limit: int) -> dict[str, Any]:
    steps = inspection.workflow_steps(run.pk, limit=limit)
    after = _dependencies(steps)
    return {
        "id": run.pk,
        "name": run.name,
        "state": run.state,
        "counts": {"steps": run.steps, "unfinished": run.unfinished, "failed": run.failed},
        "retention": run.retention,
        "created_at": run.created_at,
        "finalized_at": run.finalized_at,
        "steps": [
            {
                "job_id": step.job_id,
                "name": step.name,
                "state": step.state,
                "attempt": step.attempt,
                "max_attempts": step.max_attempts,
                "seconds": step.seconds,
                "after": after.get(step.job_id, []),
            }
            for step in steps
        ],
        "limit": limit,
        "more": run.steps > len(steps),
    }


def _after_cell(dependencies: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{dependency['step'] or dependency['job_id']}"
        + (" (any outcome)" if dependency["ignore_failure"] else "")
        for dependency in dependencies
    )


def render(data: dict[str, Any]) -> str:
    counts = data["counts"]
    retention = (
        "kept forever once ended"
        if data["retention"] is None
        else format_duration(timedelta(seconds=data["retention"]))
    )
    lines = [
        f"Workflow {data['id']}: {data['name']} ({data['state']})",
        f"  steps      {counts['steps']:,}: {counts['unfinished']:,} not ended, "
        f"{counts['failed']:,} failed or cancelled",
        f"  created    {cell(data['created_at'])}",
        f"  finished   {cell(data['finalized_at'])}",
        f"  retention  {retention}",
        "",
        table(
            ["STEP", "JOB", "STATE", "ATTEMPT", "DURATION", "AFTER"],
            [
                [
                    step["name"],
                    str(step["job_id"]),  # as typed back: no thousands separators
                    step["state"],
                    f"{step['attempt']}/{step['max_attempts']}",
                    ago(step["seconds"]),
                    _after_cell(step["after"]) or None,
                ]
                for step in data["steps"]
            ],
        ),
    ]
    if data["more"]:
        lines.append(
            f"First {len(data['steps']):,} of {counts['steps']:,} steps shown, by job id "
            "(raise --limit)."
        )
    return "\n".join(lines)


def show(stdout: Any, stderr: Any, workflow_id: int, *, limit: int, as_json: bool) -> int:
    run = _find(stderr, workflow_id)
    if run is None:
        return NOTHING
    data = workflow_data(run, limit=limit)
    stdout.write(to_json(data) if as_json else render(data))
    return OK


def steer(
    stdout: Any,
    stderr: Any,
    action: str,
    workflow_id: int,
    *,
    stdin: TextIO,
    yes: bool,
    as_json: bool,
) -> int:
    """``retry`` the failed steps of workflow ``workflow_id``, or ``cancel`` its unfinished
    ones: after asking on a terminal, unless ``yes``. Exit 1 when there is none."""
    run = _find(stderr, workflow_id)
    if run is None:
        return NOTHING
    if action == "retry":
        count = run.failed
        nothing = f"{_title(run).capitalize()} has no failed or cancelled step: nothing to retry."
        question = (
            f"Retry the failed steps of {_title(run)}? ({count:,} failed or were cancelled; "
            "the steps they cancelled come back with them, waiting for them.)"
        )
    else:
        count = run.unfinished
        nothing = f"{_title(run).capitalize()} has ended ({run.state}): nothing to cancel."
        question = (
            f"Cancel {_title(run)}? ({count:,} steps not ended: waiting ones are cancelled at "
            "once, running ones asked to stop.)"
        )
    if count and not yes and not confirm(question, stdin=stdin, stderr=stderr):
        stderr.write("Nothing changed.")
        return OK
    changed = (run.retry_failed if action == "retry" else run.cancel)() if count else 0
    if as_json:
        stdout.write(
            to_json(
                {"workflow": run.pk, "operation": action, "changed": changed, "state": run.state}
            )
        )
    elif not changed:
        stderr.write(nothing)
    else:
        steps = f"{changed:,} step{'' if changed == 1 else 's'} of {_title(run)}"
        cause = "it" if changed == 1 else "them"
        stdout.write(
            f"Retried {steps}; the steps cancelled because of {cause} are pending again."
            if action == "retry"
            else f"Cancelled {steps}; running steps are asked to stop."
        )
    return OK if changed else NOTHING
