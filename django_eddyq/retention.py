"""Retention: how long a finished job is kept, and the one rule of when it has expired.

A terminal job expires at ``finalized_at`` plus its retention: its own override for its state
(``Job.retention``, set with ``@task(retention=...)`` or ``using(retention=...)``) when the
override names the state, else ``RETENTION[state]`` as it is now. The rule is written once, as
SQL (``job_expiries``): the cleaner deletes by it, ``Job.objects`` hides by it, and
``retention_deadline`` is the same rule in Python, for the admin's "deleted by retention".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django_eddyq import sql
from django_eddyq.conf import eddyq_settings
from django_eddyq.durations import parse_duration
from django_eddyq.vocabulary import TERMINAL_STATES

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
    for state in TERMINAL_STATES:
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


def parse_retention(retention: Mapping[str, object]) -> dict[str, float | None]:
    """A per-job override: seconds to keep the job in each named terminal state; None = forever."""
    if not isinstance(retention, Mapping):
        raise TypeError(f"retention must be a dict, not {type(retention).__name__}")
    parsed: dict[str, float | None] = {}
    for state, value in retention.items():
        if state not in TERMINAL_STATES:
            raise ValueError(
                f"retention key {state!r} is not a terminal state: use {', '.join(TERMINAL_STATES)}"
            )
        parsed[state] = (
            None
            if value is None
            else parse_duration(value, name=f"retention[{state!r}]").total_seconds()
        )
    return parsed


def _names_state(override: Any, state: str) -> bool:
    """PostgreSQL's ``override ? state``: a key of an object, a string of an array, the string."""
    if isinstance(override, dict):
        return state in override
    if isinstance(override, list):
        return any(isinstance(item, str) and item == state for item in override)
    return isinstance(override, str) and override == state


def retention_deadline(
    state: str, finalized_at: datetime | None, override: Any, retention: Retention | None = None
) -> datetime | None:
    """When the cleaner deletes (and ``Job.objects`` starts hiding) a job in terminal ``state``
    finalized at ``finalized_at`` with ``Job.retention`` ``override``; None: never.

    The rule of ``job_expiries``, in Python: an override naming the state decides
    (a number of seconds, anything else keeps forever), else ``RETENTION[state]``. A job with
    no ``finalized_at`` is never deleted. The job expires at the deadline itself.
    """
    if state not in TERMINAL_STATES:
        raise ValueError(f"{state!r} is not a terminal state: no retention applies")
    if finalized_at is None:
        return None
    try:
        if _names_state(override, state):
            seconds = override.get(state) if isinstance(override, dict) else None
            if isinstance(seconds, bool) or not isinstance(seconds, int | float):
                return None
            return finalized_at + timedelta(seconds=seconds)
        if retention is None:
            retention = eddyq_settings.RETENTION
        period = bounded_period(retention.get(state))
        return None if period is None else finalized_at + period
    except OverflowError:  # past the year 9999: as good as forever
        return None


def job_retention_deadline(job: Job, retention: Retention | None = None) -> datetime | None:
    """``retention_deadline`` of a terminal ``job``."""
    return retention_deadline(job.state, job.finalized_at, job.retention, retention)
