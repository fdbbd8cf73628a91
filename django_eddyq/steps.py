"""How a workflow's steps move once stored: a step that ends releases the dependents it was the
last to wait for, or cancels them; a retried step reopens, with the steps it cancelled.

Every path that ends or retries jobs calls these in its own transaction, right after the
statement that did it (as batches are completed): a worker's pass, the rescuer, cancel and
retry. Each works on a Django or psycopg cursor, and costs nothing for jobs that are no step.
The statements, and the order they lock rows in, are in ``sql.py``'s Workflows section.

A statement whose result decides nothing here is sent without waiting for it: in a worker's
pipeline, the release, the workflows' counts and the claim after them go out together, so that
ending steps costs a pass one round trip more than ending plain jobs (END_STEPS'), not three.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django_eddyq import sql
from django_eddyq.vocabulary import JobState


def settle_ended(cursor: Any, job_ids: Iterable[int]) -> None:
    """Of the jobs ``job_ids`` (some may be no step, or not have ended), the steps that ended:
    marked ended, their dependents released or cancelled, their workflows counted."""
    ids = sorted(set(job_ids))
    if not ids:
        return
    cursor.execute(sql.END_STEPS, {"ids": ids})
    ended: list[tuple[int, int, bool]] = [
        (job_id, workflow_id, state == JobState.COMPLETED)
        for job_id, workflow_id, state in cursor.fetchall()
    ]
    _settle(cursor, ended)


def _settle(cursor: Any, ended: list[tuple[int, int, bool]]) -> None:
    """The consequences of the steps ``ended`` (job id, workflow id, completed), marked ended."""
    if not ended:
        return
    failed = [job_id for job_id, _workflow, completed in ended if not completed]
    if failed:
        cursor.execute(sql.CANCEL_DEPENDENTS, {"ids": failed})
        ended += [(job_id, workflow_id, False) for job_id, workflow_id in cursor.fetchall()]
    ended.sort()
    cursor.execute(
        sql.RELEASE_DEPENDENTS,
        {"ids": [row[0] for row in ended], "completed": [row[2] for row in ended]},
    )
    _progress(
        cursor, [(workflow_id, 1, 0 if completed else 1) for _job, workflow_id, completed in ended]
    )


def _progress(cursor: Any, changes: Sequence[tuple[int, int, int]]) -> None:
    """Counts ``changes`` (workflow id, steps finished, of them failed) into their workflows."""
    changes = sorted(changes)
    cursor.execute(
        sql.WORKFLOW_PROGRESS,
        {
            "workflow_ids": [change[0] for change in changes],
            "finished": [change[1] for change in changes],
            "failed": [change[2] for change in changes],
        },
    )


def settle_retried(cursor: Any, job_ids: Iterable[int]) -> list[int]:
    """Of the jobs ``job_ids`` just retried, the steps: unfinished again, with the steps they
    had cancelled; each waits again for its dependencies not yet met (pending), and one that
    still depends on another failed step is cancelled again, naming it. Returns the ids of the
    steps reopened."""
    ids = sorted(set(job_ids))
    if not ids:
        return []
    cursor.execute(sql.REOPEN_STEPS, {"ids": ids})
    reopened = sorted(cursor.fetchall())
    if not reopened:
        return []
    reopened_ids = [job_id for job_id, _workflow in reopened]
    cursor.execute(sql.LOCK_STEPS, {"ids": reopened_ids})
    locked = [job_id for (job_id,) in cursor.fetchall()]
    cursor.execute(sql.RECOUNT_STEPS, {"ids": locked})
    _progress(cursor, [(workflow_id, -1, -1) for _job, workflow_id in reopened])
    cursor.execute(sql.FAILED_UPSTREAMS, {"ids": reopened_ids})
    still_failed = [job_id for (job_id,) in cursor.fetchall()]
    if still_failed:
        cursor.execute(sql.CANCEL_DEPENDENTS, {"ids": still_failed})
        cancelled = [(job_id, workflow_id, False) for job_id, workflow_id in cursor.fetchall()]
        if not cancelled:
            return reopened_ids
        cursor.execute(
            sql.RELEASE_DEPENDENTS,
            {"ids": [row[0] for row in cancelled], "completed": [False] * len(cancelled)},
        )
        _progress(cursor, [(workflow_id, 1, 1) for _job, workflow_id, _ in cancelled])
    return reopened_ids
