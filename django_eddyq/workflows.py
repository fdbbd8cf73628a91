"""Workflows: jobs that wait for other jobs (chains, fan-out and fan-in, any DAG), enqueued
together in one transaction; see docs/workflows.md.

``Workflow`` builds the graph and stores it in one statement (``sql.INSERT_WORKFLOW``); from
then on the database moves it (``steps.py``): a step that ends releases the dependents it was the
last to wait for, in the transaction that ended it. A running step reads its dependencies'
results, and adds steps, through ``current_workflow()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.db import connections, transaction
from psycopg.types.json import Jsonb

from django_eddyq import sql
from django_eddyq.arguments import dumps, loads, normalize_json
from django_eddyq.conf import eddyq_settings
from django_eddyq.current import current_job
from django_eddyq.durations import parse_duration
from django_eddyq.enqueue import bound_cursor
from django_eddyq.exceptions import InvalidWorkflow
from django_eddyq.operations import cancel_many, retry_many
from django_eddyq.tasks import Signature
from django_eddyq.vocabulary import JobState

#: How long a workflow's jobs are kept once all its steps have ended, unless it says.
DEFAULT_RETENTION = timedelta(days=7)
NAME_MAX = 200


@dataclasses.dataclass(eq=False, slots=True)
class Step:
    """A step of a workflow, as ``Workflow.add`` returned it; ``job_id`` once enqueued."""

    workflow: Workflow
    name: str
    signature: Signature | None  # None: a step stored before (a running workflow's)
    after: list[Step] = dataclasses.field(default_factory=list)
    ignore_failure: bool = False
    job_id: int | None = None

    def __repr__(self) -> str:
        return f"<Step {self.name!r} of workflow {self.workflow.name!r}>"


class Workflow:
    """A graph of steps: ``add`` each with the steps it runs after, then ``enqueue``.

    ``retention`` (a duration: seconds, "7d", a ``timedelta``; None: forever) is how long its
    jobs are kept once every step has ended; until then none is deleted.
    """

    def __init__(self, name: str, *, retention: object = DEFAULT_RETENTION) -> None:
        if not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX:
            raise InvalidWorkflow(f"a workflow's name is 1 to {NAME_MAX} characters: {name!r}")
        self.name = name
        self.retention: float | None = (
            None
            if retention is None
            else parse_duration(retention, name="retention").total_seconds()
        )
        self.id: int | None = None
        self.steps: list[Step] = []
        self._own: set[int] = set()  # id() of self.steps' steps: membership in O(1)
        self._names: set[str] = set()
        self._numbered: dict[str, int] = {}  # the last number a default name was given
        self._stored: dict[str, Step] = {}  # a running workflow's steps, by name, as named

    def add(
        self,
        signature: Signature,
        *,
        after: Iterable[Step | str] = (),
        ignore_failure: bool = False,
        name: str | None = None,
    ) -> Step:
        """A step running ``signature`` once every step of ``after`` has completed (or, with
        ``ignore_failure``, ended in any way). ``name`` (default: the task's name, numbered
        from its second step) is unique in the workflow; results are read by it."""
        if not isinstance(signature, Signature):
            raise InvalidWorkflow(
                f"a step is a task's signature, task.s(...), not {type(signature).__name__}"
            )
        if self.id is not None and not self._stored:
            raise InvalidWorkflow(f"workflow {self.name!r} was enqueued: it takes no more steps")
        dependencies = [self._dependency(step) for step in after]
        step = Step(
            self,
            self._unique_name(name if name is not None else signature.name, given=name),
            signature,
            dependencies,
            bool(ignore_failure),
        )
        self.steps.append(step)
        self._own.add(id(step))
        return step

    def _dependency(self, step: Step | str) -> Step:
        if isinstance(step, str):
            if step in self._stored:
                return self._stored[step]
            for own in self.steps:
                if own.name == step:
                    return own
            if self.id is not None:  # a running workflow: a stored step, checked at enqueue
                self._stored[step] = Step(self, step, None)
                return self._stored[step]
            raise InvalidWorkflow(f"workflow {self.name!r} has no step {step!r}")
        if not isinstance(step, Step):
            raise InvalidWorkflow(f"a dependency is a step or a step's name, not {step!r}")
        if step.workflow is not self:
            raise InvalidWorkflow(
                f"step {step.name!r} is a step of workflow {step.workflow.name!r}, "
                f"not of {self.name!r}"
            )
        if step.signature is not None and id(step) not in self._own:
            raise InvalidWorkflow(f"workflow {self.name!r} has no step {step.name!r}")
        return step

    def _unique_name(self, name: str, *, given: str | None) -> str:
        if not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX:
            raise InvalidWorkflow(f"a step's name is 1 to {NAME_MAX} characters: {name!r}")
        if name in self._names:
            if given is not None:
                raise InvalidWorkflow(f"workflow {self.name!r} already has a step {name!r}")
            number = self._numbered.get(name, 1) + 1
            while f"{name}-{number}" in self._names:
                number += 1
            self._numbered[name] = number
            name = f"{name}-{number}"
        self._names.add(name)
        return name

    def after(self, step: Step, *dependencies: Step) -> None:
        """Make ``step`` also wait for ``dependencies`` (a graph ``add`` cannot express in
        order; a cycle is refused at ``enqueue``)."""
        step.after.extend(self._dependency(dependency) for dependency in dependencies)

    def enqueue(self) -> Workflow:
        """Store every step added since the last enqueue, in the caller's transaction on the
        queue's database (all of them, or none); returns the workflow, its ``id`` and its
        steps' ``job_id`` set. An invalid graph raises ``InvalidWorkflow``, storing nothing."""
        new = [step for step in self.steps if step.job_id is None]
        if self.id is not None and not self._stored and not new:
            raise InvalidWorkflow(f"workflow {self.name!r} was enqueued already")
        if not new:
            raise InvalidWorkflow(f"workflow {self.name!r} has no step to enqueue")
        ordered = _in_order(new)
        alias = eddyq_settings.DATABASE
        with transaction.atomic(using=alias), bound_cursor(alias) as cursor:
            ended = self._lock_stored(cursor, ordered)
            params = _parameters(ordered, ended)
            if self.id is None:
                statement = sql.INSERT_WORKFLOW
                params.update(name=self.name, retention=self.retention)
            else:
                statement = sql.ADD_WORKFLOW_STEPS
                params["workflow_id"] = self.id
            cursor.execute(statement, params)
            stored = cursor.fetchone()
        if stored is None:
            raise InvalidWorkflow(f"workflow {self.name!r} has ended: it takes no more steps")
        workflow_id, job_ids, _notified = stored
        for step, job_id in zip(ordered, job_ids, strict=True):
            step.job_id = job_id
        self.id = workflow_id
        return self

    def _lock_stored(self, cursor: Any, ordered: Sequence[Step]) -> dict[int, str | None]:
        """The stored steps the new ones depend on, held until the transaction ends: how each
        ended (None: not yet), by job id."""
        stored = sorted(
            {dep.name for step in ordered for dep in step.after if dep.signature is None}
        )
        if not stored:
            return {}
        cursor.execute(sql.LOCK_UPSTREAM_STEPS, {"workflow_id": self.id, "names": stored})
        found = {name: (job_id, state) for job_id, name, state in cursor.fetchall()}
        for name in stored:
            if name not in found:
                raise InvalidWorkflow(f"workflow {self.name!r} has no step {name!r}")
            self._stored[name].job_id = found[name][0]
        for step in ordered:
            for dependency in step.after:
                if dependency.signature is not None:
                    continue
                state = found[dependency.name][1]
                if state in (JobState.FAILED, JobState.CANCELLED) and not step.ignore_failure:
                    raise InvalidWorkflow(
                        f"step {dependency.name!r} of workflow {self.name!r} ended {state}: "
                        f"step {step.name!r} could never run after it"
                    )
        return dict(found.values())


def _in_order(steps: Sequence[Step]) -> list[Step]:
    """``steps`` with each after those of them it depends on; InvalidWorkflow for a cycle."""
    position = {id(step): index for index, step in enumerate(steps)}
    waiting = {id(step): 0 for step in steps}
    dependents: dict[int, list[Step]] = {id(step): [] for step in steps}
    for step in steps:
        for dependency in step.after:
            if id(dependency) in position:
                waiting[id(step)] += 1
                dependents[id(dependency)].append(step)
    ready = [step for step in steps if waiting[id(step)] == 0]
    ordered: list[Step] = []
    while ready:
        step = ready.pop()
        ordered.append(step)
        for dependent in dependents[id(step)]:
            waiting[id(dependent)] -= 1
            if waiting[id(dependent)] == 0:
                ready.append(dependent)
    if len(ordered) < len(steps):
        cycle = ", ".join(sorted(step.name for step in steps if waiting[id(step)] > 0))
        raise InvalidWorkflow(f"workflow {steps[0].workflow.name!r} has a cycle among: {cycle}")
    return ordered


def _parameters(ordered: Sequence[Step], ended: dict[int, str | None]) -> dict[str, Any]:
    """The arrays of the insert: a step's position is its index in ``ordered``, from 1."""
    position = {id(step): index for index, step in enumerate(ordered, start=1)}
    waiting = []
    edge_from: list[int | None] = []
    edge_from_jobs: list[int | None] = []
    edge_to: list[int] = []
    edge_ignore: list[bool] = []
    for index, step in enumerate(ordered, start=1):
        unmet = 0
        for dependency in dict.fromkeys(step.after):
            if dependency.signature is None:  # stored: met if it completed, or may be ignored
                state = ended.get(dependency.job_id or 0)
                met = state == JobState.COMPLETED or (state is not None and step.ignore_failure)
                edge_from.append(None)
                edge_from_jobs.append(dependency.job_id)
            else:
                met = False
                edge_from.append(position[id(dependency)])
                edge_from_jobs.append(None)
            unmet += not met
            edge_to.append(index)
            edge_ignore.append(step.ignore_failure)
        waiting.append(unmet)
    specs = [step.signature.spec for step in ordered if step.signature is not None]
    return {
        "count": len(ordered),
        "tasks": [spec.task for spec in specs],
        "args": [Jsonb(spec.args, dumps) for spec in specs],
        "kwargs": [Jsonb(spec.kwargs, dumps) for spec in specs],
        "queues": [spec.queue for spec in specs],
        "priorities": [spec.priority for spec in specs],
        "max_attempts": [spec.max_attempts for spec in specs],
        "run_ats": [spec.run_at for spec in specs],
        "delays": [spec.delay for spec in specs],
        "metadatas": [Jsonb(normalize_json(spec.metadata, where="metadata")) for spec in specs],
        "names": [step.name for step in ordered],
        "waiting": waiting,
        "limit_keys": [spec.limit_key for spec in specs],
        "edge_from": edge_from,
        "edge_from_jobs": edge_from_jobs,
        "edge_to": edge_to,
        "edge_ignore": edge_ignore,
    }


def chain(
    *signatures: Signature, name: str = "chain", retention: object = DEFAULT_RETENTION
) -> Workflow:
    """A workflow of ``signatures`` one after the other (not enqueued yet)."""
    workflow = Workflow(name, retention=retention)
    previous: list[Step] = []
    for signature in signatures:
        previous = [workflow.add(signature, after=previous)]
    return workflow


@dataclasses.dataclass(slots=True)
class Group:
    """Signatures that run side by side: ``group(a, b).then(c)`` runs ``c`` after both."""

    signatures: tuple[Signature, ...]

    def then(
        self, *signatures: Signature, name: str = "group", retention: object = DEFAULT_RETENTION
    ) -> Workflow:
        """A workflow of the group, then ``signatures`` one after the other once all of the
        group's have completed (not enqueued yet)."""
        workflow = Workflow(name, retention=retention)
        previous = [workflow.add(signature) for signature in self.signatures]
        for signature in signatures:
            previous = [workflow.add(signature, after=previous)]
        return workflow


def group(*signatures: Signature) -> Group:
    return Group(signatures)


class WorkflowContext:
    """The workflow of the step a handler runs for (``current_workflow()``): the results of
    the steps it depends on, and steps to add to it."""

    def __init__(self, workflow_id: int, step: str, job_id: int) -> None:
        self.id = workflow_id
        self.step = step  # the running step's name
        self.job_id = job_id
        self._builder = Workflow(f"#{workflow_id}", retention=None)
        self._builder.id = workflow_id
        self._builder._stored[step] = Step(self._builder, step, None, job_id=job_id)

    def results(self) -> dict[str, Any]:
        """The results of the steps this one depends on that completed, by step name (a step it
        ignores the failure of, and that failed, is left out)."""
        with connections[eddyq_settings.DATABASE].cursor() as cursor:
            cursor.execute(sql.DEPENDENCY_RESULTS, {"job_id": self.job_id})
            rows = cursor.fetchall()
        return {name: _json(result) for name, state, result in rows if state == JobState.COMPLETED}

    def result(self, step: str | Step) -> Any:
        """The result of the workflow's step ``step`` (a name); LookupError unless it
        completed."""
        name = step.name if isinstance(step, Step) else step
        with connections[eddyq_settings.DATABASE].cursor() as cursor:
            cursor.execute(sql.STEP_RESULT, {"workflow_id": self.id, "name": name})
            row = cursor.fetchone()
        if row is None:
            raise LookupError(f"workflow {self.id} has no step {name!r}")
        if row[0] != JobState.COMPLETED:
            raise LookupError(f"step {name!r} of workflow {self.id} has not completed ({row[0]})")
        return _json(row[1])

    def add(
        self,
        signature: Signature,
        *,
        after: Iterable[Step | str] = (),
        ignore_failure: bool = False,
        name: str | None = None,
    ) -> Step:
        """A step to add to this workflow (``Workflow.add``); ``after`` may name its stored
        steps, this one (``self.step``) included. Stored by ``enqueue``."""
        return self._builder.add(
            signature,
            after=after,
            ignore_failure=ignore_failure,
            name=name if name is not None else f"{signature.name}@{self.step}",
        )

    def enqueue(self) -> list[Step]:
        """Store the steps added, in the handler's transaction; returns them."""
        added = [step for step in self._builder.steps if step.job_id is None]
        self._builder.enqueue()
        return added


def _json(value: Any) -> Any:
    return loads(value) if isinstance(value, str) else value


def current_workflow() -> WorkflowContext | None:
    """The workflow of the step the calling handler runs for; None outside a workflow's step.

    Which workflow, and which step, is read from the step's row, by the job's id: the keys its
    workflow wrote in the job's metadata only say whether to look, so that a job whose metadata
    was written otherwise reads no other workflow's results and adds no step to it."""
    job = current_job()
    if job is None or "workflow" not in job.metadata:
        return None
    with connections[eddyq_settings.DATABASE].cursor() as cursor:
        cursor.execute(sql.CURRENT_STEP, {"job_id": job.id})
        row = cursor.fetchone()
    if row is None:
        return None
    workflow_id, step = row
    return WorkflowContext(workflow_id, step, job.id)


def cancel_workflow(workflow_id: int) -> int:
    """Cancel the workflow's unfinished steps (a running one is asked to stop); how many."""
    alias = eddyq_settings.DATABASE
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(sql.UNFINISHED_STEPS, {"id": workflow_id})
        changed = cancel_many(cursor, [job_id for (job_id,) in cursor.fetchall()])
        if changed:
            cursor.execute(sql.MARK_WORKFLOW_CANCELLED, {"id": workflow_id})
    return len(changed)


def retry_workflow(workflow_id: int) -> int:
    """Retry the workflow's failed and cancelled steps: those that failed, or were cancelled
    by hand; the steps they cancelled come back with them. How many steps were retried."""
    alias = eddyq_settings.DATABASE
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(sql.FAILED_STEPS, {"id": workflow_id})
        return len(retry_many(cursor, [job_id for (job_id,) in cursor.fetchall()]))
