"""Managers: ``Job.objects`` hides jobs past their retention deadline.

A job the cleaner would delete is gone as far as the application can tell, whether or not the
cleaner has run yet: the admin, the Django Tasks backend and user code never see a job that is
due for deletion. ``Job.all_objects`` still sees every row.

The rule of which jobs have expired lives here, in ``job_expiries``, and nowhere else: the
cleaner deletes by the same SQL that ``Job.objects`` hides by, so both draw the same boundary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.sql.compiler import SQLCompiler

from django_eddyq import sql
from django_eddyq.base import RETAINED_STATES
from django_eddyq.conf import eddyq_settings

if TYPE_CHECKING:
    from django_eddyq.models import Job

# A retention this long keeps rows forever: subtracting a longer period from now() could leave
# the range of timestamps, and nobody means 1,000 years but forever.
LONGEST_RETENTION = timedelta(days=365 * 1000)

type Retention = Mapping[str, timedelta | None]


@dataclass(frozen=True, slots=True)
class JobColumns:
    """How the expiry conditions refer to the columns: bare, or qualified by Django's alias."""

    state: str = "state"
    finalized_at: str = "finalized_at"
    retention: str = "retention"


@dataclass(frozen=True, slots=True)
class Expiry:
    """When jobs of one terminal state expire: those on RETENTION or those with an override.

    The two kinds are disjoint and each has an index of its own, so the cleaner sweeps them
    apart; ``sql`` is a condition with positional parameters ``params``.
    """

    state: str
    override: bool
    sql: str
    params: tuple[Any, ...]


def bounded_period(period: timedelta | None) -> timedelta | None:
    """``period``, or None (forever) if it is at least LONGEST_RETENTION."""
    return None if period is None or period >= LONGEST_RETENTION else period


def job_expiries(
    retention: Retention,
    *,
    now: str = "now()",
    now_params: Sequence[Any] = (),
    columns: JobColumns = JobColumns(),
) -> list[Expiry]:
    """The conditions under which a terminal job has expired, given RETENTION ``retention``.

    ``now`` is the SQL of the time they are evaluated at, with parameters ``now_params``.
    A state whose RETENTION is None has no default condition: only overrides expire it.
    """
    expiries = []
    for state in RETAINED_STATES:
        fields = {
            "state": columns.state,
            "finalized_at": columns.finalized_at,
            "retention": columns.retention,
            "name": state,
            "now": now,
        }
        period = bounded_period(retention.get(state))
        if period is not None:
            condition = sql.JOB_EXPIRED_BY_DEFAULT.format(**fields)
            expiries.append(Expiry(state, False, condition, (*now_params, period)))
        condition = sql.JOB_EXPIRED_BY_OVERRIDE.format(**fields)
        expiries.append(Expiry(state, True, condition, tuple(now_params)))
    return expiries


def expired_job_condition(
    retention: Retention,
    *,
    now: str = "now()",
    now_params: Sequence[Any] = (),
    columns: JobColumns = JobColumns(),
) -> tuple[str, tuple[Any, ...]]:
    """One condition, true for the jobs the cleaner deletes: all of ``job_expiries`` ORed."""
    expiries = job_expiries(retention, now=now, now_params=now_params, columns=columns)
    condition = " OR ".join(f"({expiry.sql})" for expiry in expiries)
    return condition, tuple(param for expiry in expiries for param in expiry.params)


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
