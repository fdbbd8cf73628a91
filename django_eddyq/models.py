"""The queue's tables: jobs, batches, queues, the leader lease and the activity counters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from asgiref.sync import sync_to_async
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_eddyq import operations
from django_eddyq.arguments import ExactJSONDecoder, ExactJSONEncoder
from django_eddyq.limits import MAX_PERIOD_SECONDS
from django_eddyq.managers import JobManager, QueueDatabaseManager
from django_eddyq.vocabulary import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    TERMINAL_STATES,
    WAITING_STATES,
    BatchState,
    JobState,
    WorkflowState,
)


class ExactJSONField(models.JSONField):
    """A ``JSONField`` whose floats come back as the same floats, ``-0.0`` and ``1e16``
    included (see ``django_eddyq.arguments``), and whose JSON that Python cannot read comes
    back as text.

    Migrations see a plain ``JSONField``: how floats are written changes no schema.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("encoder", ExactJSONEncoder)
        kwargs.setdefault("decoder", ExactJSONDecoder)
        super().__init__(*args, **kwargs)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        try:
            return super().from_db_value(value, expression, connection)
        except (ValueError, RecursionError):
            # JSON another producer wrote that Python cannot read (an integer of thousands of
            # digits, deep nesting) comes as its text, rather than failing every page and
            # query that loads the row.
            return value

    def deconstruct(self) -> tuple[str, str, Sequence[Any], dict[str, Any]]:
        name, _path, args, kwargs = super().deconstruct()
        kwargs.pop("encoder", None)
        kwargs.pop("decoder", None)
        return name, "django.db.models.JSONField", args, kwargs


class TransactionNow(models.Func):
    """When the current transaction started (PostgreSQL's ``now()``); Django's ``Now()`` is
    when the statement did. A job's times default to it so that a large ``enqueue_many`` can
    leave them out of its COPY and still return the ``now()`` it read in that transaction."""

    template = "CURRENT_TIMESTAMP"
    output_field = models.DateTimeField()


class Job(models.Model):
    State = JobState

    id = models.BigAutoField(primary_key=True)
    task = models.CharField(_("task"), max_length=255, help_text=_("module.qualname"))
    args = ExactJSONField(_("positional arguments"), default=list)
    kwargs = ExactJSONField(_("keyword arguments"), default=dict)
    queue = models.CharField(_("queue"), max_length=64, default="default")
    priority = models.SmallIntegerField(
        _("priority"), default=0, help_text=_("From -100 to 100; higher runs first.")
    )
    state = models.CharField(
        _("state"), max_length=16, choices=State.choices, default=State.AVAILABLE
    )
    attempt = models.PositiveIntegerField(_("attempt"), default=0)
    max_attempts = models.PositiveIntegerField(_("max attempts"), default=25)
    run_at = models.DateTimeField(_("run at"), db_default=TransactionNow())
    created_at = models.DateTimeField(_("created at"), db_default=TransactionNow())
    attempted_at = models.DateTimeField(_("attempted at"), null=True, blank=True)
    # The worker of the latest attempt, kept once the job has ended (locked_by is cleared).
    attempted_by = models.CharField(  # noqa: DJ001
        _("attempted by"), max_length=255, null=True, blank=True
    )
    finalized_at = models.DateTimeField(_("finalized at"), null=True, blank=True)
    # NULL, not "", is how the SQL tells an unlocked job.
    locked_by = models.CharField(  # noqa: DJ001
        _("locked by"), max_length=255, null=True, blank=True
    )
    locked_until = models.DateTimeField(_("locked until"), null=True, blank=True)
    heartbeat_at = models.DateTimeField(_("heartbeat at"), null=True, blank=True)
    errors = ExactJSONField(_("errors"), default=list)
    result = ExactJSONField(_("result"), null=True, blank=True)
    batch = models.ForeignKey(
        "Batch",
        verbose_name=_("batch"),
        null=True,
        blank=True,
        related_name="jobs",
        # The database sets it NULL (see the migration): maintenance deletes batches in SQL.
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        # eddyq_jobs_batch_idx covers the jobs that have a batch; an index of every job would
        # take an entry for each row version of each job (every claim and finish), for nothing.
        db_index=False,
    )
    retention = ExactJSONField(
        _("retention override"),
        null=True,
        blank=True,
        help_text=_("Seconds to keep this job per terminal state; null keeps it forever."),
    )
    metadata = ExactJSONField(_("metadata"), default=dict)
    cancel_requested_at = models.DateTimeField(
        _("cancel requested at"),
        null=True,
        blank=True,
        help_text=_("Set when a running job is cancelled: its worker stops it as it can."),
    )
    # NULL, not "": the unique index covers only the jobs that hold a key.
    unique_key = models.TextField(  # noqa: DJ001
        _("unique key"),
        null=True,
        blank=True,
        help_text=_("While set, no other job with this key can be enqueued."),
    )

    # NULL for the jobs of tasks without per-key limits, which the plain claim takes.
    limit_key = models.TextField(  # noqa: DJ001
        _("limit key"),
        null=True,
        blank=True,
        help_text=_(
            "The key its task's limits count it under; empty when the task is limited as a whole."
        ),
    )

    # Every row, expired or not: for maintenance and forensics.
    all_objects = QueueDatabaseManager()
    # Jobs past their retention deadline are invisible, with the cleaner's boundary.
    objects = JobManager()

    class Meta:
        default_manager_name = "objects"
        base_manager_name = "all_objects"
        db_table = "eddyq_jobs"
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        ordering: ClassVar[list[str]] = ["-id"]
        # Arguments and results can hold personal data or secrets, as can tracebacks: the
        # admin shows them (batches' callback arguments too) only with this permission.
        permissions = (("view_job_payload", "Can view job arguments, results and tracebacks"),)
        constraints: ClassVar[list[Any]] = [
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="eddyq_jobs_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(state__in=JobState.values), name="eddyq_jobs_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1), name="eddyq_jobs_max_attempts"
            ),
            # Unique jobs: enforced by the database, not by a read-then-write.
            models.UniqueConstraint(
                "unique_key", name="eddyq_jobs_unique_key", condition=Q(unique_key__isnull=False)
            ),
        ]
        indexes: ClassVar[list[models.Index]] = [
            # The claim reads available jobs in priority then run_at order straight off an
            # index: across all queues, or within the queues a worker was given. Jobs with a
            # limit key are left to the keyed claim, and out of these indexes, so that no
            # plain claim reads past a key's backlog held back by its limit.
            models.Index(
                models.F("priority").desc(),
                "run_at",
                "id",
                name="eddyq_jobs_claim_idx",
                condition=Q(state=JobState.AVAILABLE, limit_key__isnull=True),
            ),
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_at",
                "id",
                name="eddyq_jobs_queue_claim_idx",
                condition=Q(state=JobState.AVAILABLE, limit_key__isnull=True),
            ),
            # The keyed claim reads keyed jobs in claim order first, and walks the keys only
            # when those have no room.
            models.Index(
                models.F("priority").desc(),
                "run_at",
                "id",
                name="eddyq_jobs_keyed_order_idx",
                condition=Q(state=JobState.AVAILABLE, limit_key__isnull=False),
            ),
            # The keyed claim walks the keys of each queue one index probe each (the first
            # entry of a (queue, task, key) is that key's next job there), and counts the jobs
            # running per key; the queue's keyed jobs are counted along it.
            models.Index(
                "queue",
                "task",
                "limit_key",
                models.F("priority").desc(),
                "run_at",
                "id",
                name="eddyq_jobs_keyed_claim_idx",
                condition=Q(state=JobState.AVAILABLE, limit_key__isnull=False),
            ),
            models.Index(
                "task",
                "limit_key",
                name="eddyq_jobs_keyed_running_idx",
                condition=Q(state=JobState.RUNNING, limit_key__isnull=False),
            ),
            # The scheduler promotes due scheduled and retryable jobs.
            models.Index(
                "run_at",
                name="eddyq_jobs_due_idx",
                condition=Q(state__in=list(WAITING_STATES)),
            ),
            # The rescuer finds running jobs whose lease has passed.
            models.Index(
                "locked_until",
                name="eddyq_jobs_lease_idx",
                condition=Q(state=JobState.RUNNING),
            ),
            # The cleaner and the admin walk terminal jobs by state and age.
            models.Index(
                "state",
                "finalized_at",
                name="eddyq_jobs_finalized_idx",
                condition=Q(state__in=list(TERMINAL_STATES)),
            ),
            # Jobs that carry their own retention, for the cleaner's second sweep.
            models.Index(
                "state",
                "finalized_at",
                name="eddyq_jobs_retention_idx",
                condition=Q(state__in=list(TERMINAL_STATES), retention__isnull=False),
            ),
            models.Index("batch", name="eddyq_jobs_batch_idx", condition=Q(batch__isnull=False)),
            # Workflows' steps waiting for their dependencies: the overview counts them along
            # it; a job that is no step never has an entry.
            models.Index("id", name="eddyq_jobs_pending_idx", condition=Q(state=JobState.PENDING)),
            # The admin's task filter. Only the jobs that stay a while: every row version of a
            # job passing through (available, then running) would cost an index entry of its
            # own on each enqueue and each claim.
            models.Index(
                "task",
                "state",
                name="eddyq_jobs_task_idx",
                condition=~Q(state__in=[JobState.AVAILABLE, JobState.RUNNING]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task}#{self.pk} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def cancel(self) -> bool:
        """Cancel the job; False if it had already ended (or was already being cancelled).

        A job not yet running is cancelled at once. A running one is flagged: its worker hears
        of it at once (or at its next heartbeat), cancels an async handler, and a handler that
        then raises ends ``cancelled``, never retried; one that returns anyway ends
        ``completed``, since its work was done. Safe to call twice, concurrently, from any
        process. Refreshes this instance.
        """
        changed = operations.cancel_job(self.pk)
        self.refresh_from_db()
        return changed

    async def acancel(self) -> bool:
        """``cancel`` for async code."""
        return await sync_to_async(self.cancel, thread_sensitive=True)()

    async def aretry(self) -> bool:
        """``retry`` for async code."""
        return await sync_to_async(self.retry, thread_sensitive=True)()

    async def arefresh(self) -> None:
        """Read the job again, from async code: its state, result, errors, as they are now."""
        await self.arefresh_from_db()

    def retry(self) -> bool:
        """Make a failed, cancelled, retryable or scheduled job available now.

        Its error history stays; its result and finalized_at are cleared, and it gets one more
        attempt if it had used them all. An available or running job is left alone (False);
        a completed one raises ``ValueError``. Refreshes this instance.
        """
        changed = operations.retry_job(self.pk)
        self.refresh_from_db()
        return changed


class Batch(models.Model):
    State = BatchState

    id = models.BigAutoField(primary_key=True)
    state = models.CharField(
        _("state"), max_length=16, choices=State.choices, default=State.PENDING
    )
    sealed = models.BooleanField(
        _("sealed"), default=False, help_text=_("No more jobs can join once sealed.")
    )
    callback_task = models.CharField(_("callback task"), max_length=255, blank=True)
    callback_args = ExactJSONField(_("callback arguments"), default=list)
    callback_kwargs = ExactJSONField(_("callback keyword arguments"), default=dict)
    callback_job = models.BigIntegerField(_("callback job id"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    finalized_at = models.DateTimeField(_("finalized at"), null=True, blank=True)
    metadata = ExactJSONField(_("metadata"), default=dict)

    objects = QueueDatabaseManager()

    class Meta:
        db_table = "eddyq_batches"
        verbose_name = _("batch")
        verbose_name_plural = _("batches")
        ordering: ClassVar[list[str]] = ["-id"]
        indexes: ClassVar[list[models.Index]] = [
            models.Index(
                "finalized_at",
                name="eddyq_batches_finalized_idx",
                condition=Q(state=BatchState.COMPLETE),
            ),
        ]

    def __str__(self) -> str:
        return f"batch {self.pk} ({self.state})"


class WorkflowRun(models.Model):
    """A workflow as enqueued (``workflows.Workflow``): its steps are jobs, with a row each in
    ``WorkflowStep`` and their dependencies in ``WorkflowEdge``.

    ``unfinished`` counts the steps not yet ended and ``failed`` those that ended failed or
    cancelled; both change in the transaction that ends (or retries) a step. When the last step
    ends the workflow is finalized, and its jobs are kept ``retention`` seconds more (null:
    forever); the cleaner then deletes them with the workflow.
    """

    State = WorkflowState

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(_("name"), max_length=200)
    state = models.CharField(
        _("state"), max_length=16, choices=State.choices, default=State.RUNNING
    )
    retention = models.FloatField(
        _("retention in seconds"),
        null=True,
        blank=True,
        help_text=_("How long its jobs are kept once every step has ended; null: forever."),
    )
    steps = models.PositiveIntegerField(_("steps"), default=0)
    unfinished = models.PositiveIntegerField(_("unfinished steps"), default=0)
    failed = models.PositiveIntegerField(_("failed or cancelled steps"), default=0)
    created_at = models.DateTimeField(_("created at"), db_default=TransactionNow())
    finalized_at = models.DateTimeField(_("finalized at"), null=True, blank=True)

    objects = QueueDatabaseManager()

    class Meta:
        db_table = "eddyq_workflows"
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")
        ordering: ClassVar[list[str]] = ["-id"]
        indexes: ClassVar[list[models.Index]] = [
            # The cleaner finds the finalized workflows past their retention.
            models.Index(
                "finalized_at",
                name="eddyq_workflows_final_idx",
                condition=Q(finalized_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"workflow {self.name} #{self.pk} ({self.state})"

    def cancel(self) -> int:
        """Cancel every unfinished step (a running one is asked to stop); the steps changed."""
        from django_eddyq import workflows

        changed = workflows.cancel_workflow(self.pk)
        self.refresh_from_db()
        return changed

    def retry_failed(self) -> int:
        """Retry every failed or cancelled step; the steps they cancelled come back pending."""
        from django_eddyq import workflows

        changed = workflows.retry_workflow(self.pk)
        self.refresh_from_db()
        return changed


class WorkflowStep(models.Model):
    """A step of a workflow: its job (same id), its name in the workflow, how many of the steps
    it depends on have not yet ended as it needs (``waiting_on``: it is released at 0), how it
    ended (null while unfinished), and, cancelled because a step it depends on failed, the
    step that started it (``cancelled_by``: retrying that one brings it back)."""

    job_id = models.BigIntegerField(_("job"), primary_key=True)
    workflow = models.ForeignKey(
        WorkflowRun,
        verbose_name=_("workflow"),
        related_name="step_rows",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
    )
    name = models.CharField(_("name"), max_length=200)
    waiting_on = models.PositiveIntegerField(_("dependencies not yet met"), default=0)
    ended_state = models.CharField(_("ended"), max_length=16, null=True, blank=True)  # noqa: DJ001
    cancelled_by = models.BigIntegerField(_("cancelled because of job"), null=True, blank=True)

    objects = QueueDatabaseManager()

    class Meta:
        db_table = "eddyq_workflow_steps"
        verbose_name = _("workflow step")
        verbose_name_plural = _("workflow steps")
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint("workflow", "name", name="eddyq_workflow_steps_name"),
        ]
        indexes: ClassVar[list[models.Index]] = [
            # Retrying a step finds the steps it cancelled.
            models.Index(
                "cancelled_by",
                name="eddyq_workflow_steps_cause_idx",
                condition=Q(cancelled_by__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"step {self.name} (job {self.job_id})"


class WorkflowEdge(models.Model):
    """``downstream`` starts once ``upstream`` has completed (or, with ``ignore_failure``, ended
    in any way). Keyed upstream first: ending a step reads its edges by that key."""

    pk = models.CompositePrimaryKey("upstream_id", "downstream_id")
    upstream_id = models.BigIntegerField(_("upstream job"))
    downstream_id = models.BigIntegerField(_("downstream job"))
    ignore_failure = models.BooleanField(_("ignore failure"), default=False)

    objects = QueueDatabaseManager()

    class Meta:
        db_table = "eddyq_workflow_edges"
        verbose_name = _("workflow dependency")
        verbose_name_plural = _("workflow dependencies")
        indexes: ClassVar[list[models.Index]] = [
            models.Index("downstream_id", name="eddyq_workflow_edges_down_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.upstream_id} -> {self.downstream_id}"


class Queue(models.Model):
    name = models.CharField(_("name"), max_length=64, primary_key=True)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    updated_at = models.DateTimeField(_("updated at"), db_default=Now())
    metadata = ExactJSONField(_("metadata"), default=dict)
    # Flow control (``limits.py``), across every worker; enforced by the claim.
    concurrency = models.IntegerField(
        _("concurrency"),
        null=True,
        blank=True,
        help_text=_("At most this many of the queue's jobs run at once, on all workers."),
    )
    rate_limit = models.IntegerField(_("rate: jobs"), null=True, blank=True)
    rate_period = models.FloatField(_("rate: period in seconds"), null=True, blank=True)
    rate_burst = models.IntegerField(_("rate: burst"), null=True, blank=True)

    objects = QueueDatabaseManager()

    class Meta:
        db_table = "eddyq_queues"
        verbose_name = _("queue")
        verbose_name_plural = _("queues")
        ordering: ClassVar[list[str]] = ["name"]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            # The claim divides by the period and trusts these: a row cannot hold others.
            models.CheckConstraint(
                condition=Q(concurrency__isnull=True) | Q(concurrency__gte=1),
                name="eddyq_queues_concurrency_valid",
            ),
            models.CheckConstraint(
                condition=(
                    Q(rate_limit__isnull=True, rate_period__isnull=True, rate_burst__isnull=True)
                    | Q(
                        # A NULL beside the others would make the check unknown, which passes.
                        rate_limit__isnull=False,
                        rate_period__isnull=False,
                        rate_burst__isnull=False,
                        rate_limit__gte=1,
                        rate_period__gt=0,
                        # Also keeps out NaN and infinity, which PostgreSQL counts above 0.
                        rate_period__lte=MAX_PERIOD_SECONDS,
                        rate_burst__gte=1,
                        rate_burst__lte=F("rate_limit"),
                    )
                ),
                name="eddyq_queues_rate_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_paused(self) -> bool:
        return self.paused_at is not None

    def pause(self) -> Queue:
        """See ``django_eddyq.pause_queue``; refreshes this instance."""
        operations.set_queue_paused(self.name, paused=True)
        self.refresh_from_db(fields=["paused_at"])
        return self

    def resume(self) -> Queue:
        """See ``django_eddyq.resume_queue``; refreshes this instance."""
        operations.set_queue_paused(self.name, paused=False)
        self.refresh_from_db(fields=["paused_at"])
        return self


class RateBucket(models.Model):
    """A rate limit's token bucket, as the last claim under that limit left it: ``tokens``
    left at ``refilled_at`` (the database's clock). Written only by claims, under the limit's
    advisory lock: a table of its own, so that no other writer of the queue's row (an enqueue
    touches it in its own transaction) ever holds up a claim. No row: a full bucket."""

    # A queue's name, or "task:<path>:<key>" for a key of a task (queue names hold no colon).
    name = models.TextField(_("limit"), primary_key=True)
    tokens = models.FloatField(_("tokens"))
    refilled_at = models.DateTimeField(_("counted at"))
    # When the bucket is full again, no row then meaning the same: the queue cleaner deletes
    # the rows past it, so that keys used once do not pile up.
    full_at = models.DateTimeField(_("full at"), null=True, blank=True)

    objects = QueueDatabaseManager()

    class Meta:
        db_table = "eddyq_rate_buckets"
        verbose_name = _("rate bucket")
        verbose_name_plural = _("rate buckets")

    def __str__(self) -> str:
        return f"{self.name}: {self.tokens:g} tokens"


class WorkerProcess(models.Model):
    """A worker process, as it registered itself and renews with its heartbeats.

    ``last_seen_at`` is by the database's clock. A worker that stopped gracefully says so
    (``stopped_at``); one unseen for longer than ``STALE_AFTER`` without having stopped is lost
    (killed, frozen, cut off). The cleaner deletes the rows of workers unseen for longer than
    ``WORKER_RETENTION``.
    """

    id = models.CharField(_("worker id"), max_length=255, primary_key=True)
    host = models.CharField(_("host"), max_length=255)
    pid = models.IntegerField(_("pid"))
    version = models.CharField(_("version"), max_length=64)
    queues = models.JSONField(_("queues"), null=True, blank=True, help_text=_("null: all"))
    concurrency = models.PositiveIntegerField(_("concurrency"))
    started_at = models.DateTimeField(_("started at"), db_default=Now())
    last_seen_at = models.DateTimeField(_("last seen at"), db_default=Now())
    running = models.PositiveIntegerField(_("jobs running"), default=0)
    leader = models.BooleanField(_("leader"), default=False)
    stopped_at = models.DateTimeField(_("stopped at"), null=True, blank=True)

    objects = QueueDatabaseManager()

    class Meta:
        db_table = "eddyq_workers"
        verbose_name = _("worker")
        verbose_name_plural = _("workers")
        ordering: ClassVar[list[str]] = ["-started_at"]

    def __str__(self) -> str:
        return self.id


class Leader(models.Model):
    name = models.CharField(_("election"), max_length=64, primary_key=True)
    leader_id = models.CharField(_("leader"), max_length=255)
    elected_at = models.DateTimeField(_("elected at"), db_default=Now())
    expires_at = models.DateTimeField(_("expires at"))

    objects = QueueDatabaseManager()

    class Meta:
        db_table = "eddyq_leader"
        verbose_name = _("leader")
        verbose_name_plural = _("leaders")

    def __str__(self) -> str:
        return f"{self.name}: {self.leader_id}"


class PeriodicSchedule(models.Model):
    """Where each schedule stands: the last run the periodic enqueuer dealt with, whether an
    operator has disabled it, and the job of its last enqueued run.

    Enqueuing a run advances ``last_run_at`` in the same transaction, only forwards, so that no
    run is enqueued twice, not even by two leaders across a failover, and not after the cleaner
    deleted the job of that run. A disabled schedule enqueues nothing; enabling it again moves
    ``last_run_at`` to its latest run, so that it resumes from the next one.
    ``last_job_id`` is a plain number, not a foreign key: the cleaner deletes jobs.
    """

    name = models.CharField(_("schedule"), max_length=200, primary_key=True)
    last_run_at = models.DateTimeField(_("last run at"))
    updated_at = models.DateTimeField(_("updated at"), db_default=Now())
    # db_default too: a worker of the previous release inserts rows without the column.
    enabled = models.BooleanField(_("enabled"), default=True, db_default=True)
    last_job_id = models.BigIntegerField(_("last run's job"), null=True, blank=True)

    objects = QueueDatabaseManager()

    class Meta:
        db_table = "eddyq_periodic"
        verbose_name = _("periodic schedule")
        verbose_name_plural = _("periodic schedules")

    def __str__(self) -> str:
        return f"{self.name}: last run {self.last_run_at.isoformat()}"


class Activity(models.Model):
    """Jobs finished per minute and queue, and each queue's sampled depth: what the admin's
    charts and ``eddyq status`` read, so that neither counts finished jobs.

    A worker adds its pass's outcomes to its own row of the minute (``source`` is its id, so
    that workers never wait on each other's row), in the statement that writes them; the
    rescuer adds what it rescued (``source`` "rescuer"). The activity sampler
    (``maintenance/activity.py``) writes each queue's available jobs (``source`` "sampler"),
    folds the rows of each hour past the last one into one row per queue (``source`` "hour",
    ``minute`` the hour's start, ``available`` the hour's highest sample) and deletes the rows
    older than ``ACTIVITY_RETENTION``. Minutes are the database's, in UTC.
    """

    pk = models.CompositePrimaryKey("minute", "queue", "source")
    minute = models.DateTimeField(_("minute"))
    queue = models.CharField(_("queue"), max_length=64)
    source = models.CharField(_("source"), max_length=255)
    completed = models.BigIntegerField(_("completed"), db_default=0)
    failed = models.BigIntegerField(_("failed"), db_default=0)
    retried = models.BigIntegerField(_("retried"), db_default=0)
    cancelled = models.BigIntegerField(_("cancelled"), db_default=0)
    snoozed = models.BigIntegerField(_("snoozed"), db_default=0)
    available = models.BigIntegerField(_("available jobs"), null=True, blank=True)

    objects = QueueDatabaseManager()

    class Meta:
        db_table = "eddyq_activity"
        verbose_name = _("activity")
        verbose_name_plural = _("activity")

    def __str__(self) -> str:
        return f"{self.queue} at {self.minute.isoformat()} ({self.source})"
