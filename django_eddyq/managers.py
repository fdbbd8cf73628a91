"""Managers: ``Job.objects`` hides jobs past their retention deadline.

A job the cleaner would delete is gone as far as the application can tell, whether or not the
cleaner has run yet: the admin, the Django Tasks backend and user code never see a job that is
due for deletion. ``Job.all_objects`` still sees every row.

The rule of which jobs have expired is ``retention.job_expiries``: the cleaner deletes by the
same SQL that ``Job.objects`` hides by, so both draw the same boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.sql.compiler import SQLCompiler

from django_eddyq.conf import eddyq_settings
from django_eddyq.retention import JobColumns, expired_job_condition

if TYPE_CHECKING:
    from django_eddyq.models import Job


class Unexpired(models.Expression):
    """True for the jobs not past their retention deadline.

    It is the cleaner's condition, negated; a NULL (say, a terminal job without
    ``finalized_at``) counts as not expired, since the cleaner keeps such a job too. It is
    rendered when the query is compiled, so it follows RETENTION as it is then, and evaluated
    by the database's clock, ``now()``. Each of its terms begins with ``state = '<terminal
    state>'``, so a query for other states still uses their partial indexes.
    """

    conditional = True
    output_field = models.BooleanField()

    def __init__(self) -> None:
        super().__init__()
        # Resolved to the query's own aliases, so joins and subqueries stay unambiguous.
        self.columns: list[Any] = [
            models.F("state"),
            models.F("finalized_at"),
            models.F("retention"),
        ]

    def get_source_expressions(self) -> list[Any]:
        return self.columns

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        self.columns = list(exprs)

    def as_sql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any
    ) -> tuple[str, tuple[Any, ...]]:
        state, finalized_at, retention = (compiler.compile(column)[0] for column in self.columns)
        condition, params = expired_job_condition(
            eddyq_settings.RETENTION,
            columns=JobColumns(state=state, finalized_at=finalized_at, retention=retention),
        )
        return f"({condition}) IS NOT TRUE", params


class QueueDatabaseManager[M: models.Model](models.Manager[M]):
    """Reads from the queue's database (``EDDYQ["DATABASE"]``) unless told another alias.

    So the admin and user code find the jobs where the queue keeps them without a router.
    """

    def get_queryset(self) -> models.QuerySet[M]:
        return models.QuerySet(self.model, using=self._db or eddyq_settings.DATABASE)


class JobManager(QueueDatabaseManager["Job"]):
    """The default manager of jobs: every job but those past their retention deadline."""

    def get_queryset(self) -> models.QuerySet[Job]:
        return super().get_queryset().filter(Unexpired())
