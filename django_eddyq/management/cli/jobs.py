"""``eddyq job ID``: one job, all of it: its arguments and result, every attempt with its worker,
error and traceback, and when it ran and when retention deletes it. ``eddyq jobs``: the newest
jobs of a filter, a line each."""

from __future__ import annotations

import json
from typing import Any

from django_eddyq.inspection import LastErrorLine
from django_eddyq.management.cli.output import NOTHING, OK, cell, table, to_json
from django_eddyq.models import Job
from django_eddyq.retention import job_retention_deadline
from django_eddyq.selection import JobFilter
from django_eddyq.vocabulary import JobState


def job_data(job: Job) -> dict[str, Any]:
    """Everything stored of ``job``, as JSON-ready values; the errors as stored, whatever their
    shape."""
    running = job.state == Job.State.RUNNING
    return {
        "id": job.pk,
        "task": job.task,
        "state": job.state,
        "queue": job.queue,
        "priority": job.priority,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "created_at": job.created_at,
        "run_at": job.run_at,
        "attempted_at": job.attempted_at,
        "worker": (job.locked_by if running else None) or job.attempted_by,
        "locked_until": job.locked_until,
        "heartbeat_at": job.heartbeat_at,
        "cancel_requested_at": job.cancel_requested_at,
        "finalized_at": job.finalized_at,
        "deleted_at": job_retention_deadline(job) if job.is_terminal else None,
        "kept_forever": job.is_terminal and job_retention_deadline(job) is None,
        "batch_id": job.batch_id,
        "unique_key": job.unique_key,
        "args": job.args,
        "kwargs": job.kwargs,
        "result": job.result,
        "metadata": job.metadata,
        "retention": job.retention,
        "errors": job.errors,
    }


def render(data: dict[str, Any]) -> str:
    def stored(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, default=str)

    if data["deleted_at"] is not None:
        deletion = cell(data["deleted_at"])
    elif data["kept_forever"]:
        deletion = "kept forever"
    else:
        deletion = "— (not finished)"
    fields = [
        ("queue", data["queue"]),
        ("priority", data["priority"]),
        ("attempt", f"{data['attempt']} of {data['max_attempts']}"),
        ("enqueued", cell(data["created_at"])),
        ("due", cell(data["run_at"])),
        ("last attempt", cell(data["attempted_at"])),
        ("worker", cell(data["worker"])),
    ]
    if data["state"] == Job.State.RUNNING:
        fields += [
            ("lease until", cell(data["locked_until"])),
            ("heartbeat", cell(data["heartbeat_at"])),
        ]
    if data["cancel_requested_at"] is not None:
        fields.append(("cancel asked", cell(data["cancel_requested_at"])))
    fields += [
        ("finished", cell(data["finalized_at"])),
        ("deleted by retention", deletion),
        ("batch", cell(None if data["batch_id"] is None else str(data["batch_id"]))),
        ("unique key", cell(data["unique_key"])),
        ("args", stored(data["args"])),
        ("kwargs", stored(data["kwargs"])),
        ("result", stored(data["result"])),
        ("metadata", stored(data["metadata"])),
    ]
    width = max(len(name) for name, _ in fields)
    lines = [f"Job {data['id']}: {data['task']} ({data['state']})"]
    lines += [f"  {name.ljust(width)}  {value}" for name, value in fields]
    errors = data["errors"]
    lines.append("")
    if not isinstance(errors, list) or not errors:
        lines.append("No failed attempts." if not errors else f"Errors: {stored(errors)}")
        return "\n".join(lines)
    lines.append("Failed attempts:")
    for number, entry in enumerate(errors, start=1):
        if not isinstance(entry, dict):
            lines.append(f"  {number}. {stored(entry)}")
            continue
        worker = entry.get("worker") or (
            f"rescued from {entry['rescued_from']}" if entry.get("rescued_from") else None
        )
        heading = " · ".join(
            str(part)
            for part in (
                f"attempt {entry.get('attempt', number)}",
                entry.get("at"),
                worker,
                entry.get("error"),
            )
            if part
        )
        lines.append(f"  {heading}")
        traceback = entry.get("traceback")
        if traceback:
            lines += [f"      {line}" for line in str(traceback).rstrip().splitlines()]
    return "\n".join(lines)


def show_job(stdout: Any, stderr: Any, job_id: int, *, as_json: bool) -> int:
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        stderr.write(f"No job {job_id} (never enqueued, or deleted by retention).")
        return NOTHING
    data = job_data(job)
    stdout.write(to_json(data) if as_json else render(data))
    return OK


# eddyq jobs


#: The most jobs ``eddyq jobs`` lists at once.
MAX_LIMIT = 10_000
LISTED_FIELDS = (
    "id",
    "task",
    "state",
    "queue",
    "attempt",
    "max_attempts",
    "created_at",
    "finalized_at",
    "cancel_requested_at",
)


def list_jobs(stdout: Any, stderr: Any, selection: JobFilter, *, limit: int, as_json: bool) -> int:
    """The newest ``limit`` jobs of ``selection``, newest first: one query ordered by id, which
    stops at the limit, and never a count of every match."""
    rows = list(
        selection.apply(Job.objects.all())
        .order_by("-id")
        .annotate(last_error=LastErrorLine("errors"))
        .values(*LISTED_FIELDS, "last_error")[: limit + 1]
    )
    more = len(rows) > limit
    rows = rows[:limit]
    if as_json:
        stdout.write(to_json({"jobs": rows, "limit": limit, "more": more}))
        return OK if rows else NOTHING
    if not rows:
        stderr.write(f"No {selection.describe()}.")
        return NOTHING
    stdout.write(
        table(
            ["ID", "TASK", "STATE", "QUEUE", "ATTEMPT", "CREATED", "FINISHED", "LAST ERROR"],
            [
                [
                    str(row["id"]),  # as typed back: no thousands separators
                    row["task"],
                    row["state"]
                    + (
                        " (cancel requested)"
                        if row["state"] == JobState.RUNNING and row["cancel_requested_at"]
                        else ""
                    ),
                    row["queue"],
                    f"{row['attempt']}/{row['max_attempts']}",
                    row["created_at"],
                    row["finalized_at"],
                    row["last_error"],
                ]
                for row in rows
            ],
        )
    )
    if more:
        stdout.write(f"First {limit:,} shown, newest first; more match (raise --limit, or filter).")
    return OK
