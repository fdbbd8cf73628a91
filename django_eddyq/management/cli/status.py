"""``eddyq status``: each queue's jobs, the leader and the workers, at a glance.

Every read is bounded whatever the size of the tables: the jobs per queue and state are the
Prometheus gauges' one statement (``metrics.read_gauges``: exact up to a bound, estimated past
it), the jobs completed and failed lately from the activity counters (``activity.recent_counts``:
the rows of the last 16 minutes), the leader and the workers from their own small tables.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import connections

from django_eddyq import activity, inspection, metrics
from django_eddyq.conf import eddyq_settings
from django_eddyq.db import database_now
from django_eddyq.management.cli.output import NOTHING, OK, ago, cell, table, to_json
from django_eddyq.models import WorkerProcess
from django_eddyq.vocabulary import JobState

#: The states a queue's row shows, in its columns' order.
SHOWN_STATES = (
    JobState.PENDING,
    JobState.AVAILABLE,
    JobState.SCHEDULED,
    JobState.RUNNING,
    JobState.RETRYABLE,
    JobState.COMPLETED,
    JobState.FAILED,
    JobState.CANCELLED,
)
#: Workers listed, at most (those running first, then the lost).
WORKER_LIMIT = 50
#: How long the jobs' read may take: longer than a scrape's, as an operator would rather wait
#: for a cold cache (a server just started, a table just restored) than be told nothing.
READ_TIMEOUT_SECONDS = 30.0


class DatabaseUnreadable(Exception):
    """The queue's database could not be read; the message says why."""


@dataclass
class QueueStatus:
    name: str
    paused: bool
    jobs: dict[str, int]
    estimated: list[str]
    oldest_due_seconds: float | None
    # Jobs completed and failed within the last 1, 5 and 15 minutes, keyed "1m", "5m", "15m".
    completed_recently: dict[str, int]
    failed_recently: dict[str, int]


@dataclass
class Status:
    database: str
    now: datetime
    queues: list[QueueStatus]
    leader: dict[str, Any] | None
    workers: list[dict[str, Any]]
    workers_stopped: int
    problems: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems


def read_status() -> Status:
    alias = eddyq_settings.DATABASE
    gauges = metrics.read_gauges(alias, timeout=READ_TIMEOUT_SECONDS)
    if not gauges.ok:
        raise DatabaseUnreadable(gauges.error or "the read failed")
    with connections[alias].cursor() as cursor:
        now = database_now(cursor)
    recent = activity.recent_counts(using=alias)
    nothing = activity.RecentCounts(
        completed=dict.fromkeys(activity.RECENT_MINUTES, 0),
        failed=dict.fromkeys(activity.RECENT_MINUTES, 0),
    )
    queues = [
        QueueStatus(
            name=name,
            paused=gauges.paused.get(name, False),
            jobs={
                state.value: round(gauges.jobs.get((name, state.value), 0))
                for state in SHOWN_STATES
            },
            estimated=sorted(state for queue, state in gauges.estimated if queue == name),
            oldest_due_seconds=gauges.latency.get(name) or None,
            completed_recently=_by_window(recent.get(name, nothing).completed),
            failed_recently=_by_window(recent.get(name, nothing).failed),
        )
        for name in sorted(gauges.paused)
    ]
    leader = inspection.Overview(alias).leader
    workers = inspection.with_worker_status(WorkerProcess.objects.using(alias))
    live = list(
        workers.filter(stopped_at__isnull=True)
        .order_by("status_order", "host", "id")
        .values(
            "id",
            "host",
            "pid",
            "version",
            "queues",
            "concurrency",
            "running",
            "leader",
            "status",
            "seen_ago",
            "started_at",
        )[:WORKER_LIMIT]
    )
    status = Status(
        database=alias,
        now=now.astimezone(UTC),
        queues=queues,
        leader=None
        if leader is None
        else {
            "worker": leader.leader_id,
            "elected_at": leader.elected_at,
            "expires_at": leader.expires_at,
            "active": leader.active,
        },
        workers=[
            {**worker, "seen_seconds_ago": worker.pop("seen_ago").total_seconds()}
            for worker in live
        ],
        workers_stopped=workers.filter(stopped_at__isnull=False).count(),
    )
    if not any(worker["status"] == "running" for worker in status.workers):
        status.problems.append("no worker is running")
    if leader is None or not leader.active:
        status.problems.append("no leader holds the lease: maintenance is not running")
    return status


def _by_window(counts: dict[int, int]) -> dict[str, int]:
    return {f"{minutes}m": count for minutes, count in counts.items()}


def _recently(counts: dict[str, int]) -> str:
    """ "3/12/40": the counts of the last 1, 5 and 15 minutes."""
    return "/".join(f"{count:,}" for count in counts.values())


def as_data(status: Status) -> dict[str, Any]:
    return {
        "database": status.database,
        "now": status.now,
        "healthy": status.healthy,
        "problems": status.problems,
        "queues": [vars(queue) for queue in status.queues],
        "leader": status.leader,
        "workers": status.workers,
        "workers_stopped": status.workers_stopped,
    }


def render(status: Status) -> str:
    lines = [
        f"django-eddyq status: database {status.database!r}, "
        f"{cell(status.now)} by the database's clock",
        "",
    ]
    if status.queues:
        rows = []
        for queue in status.queues:
            counts = [
                f"≈{queue.jobs[state]:,}" if state in queue.estimated else queue.jobs[state]
                for state in SHOWN_STATES
            ]
            rows.append(
                [
                    queue.name,
                    queue.paused,
                    *counts,
                    ago(queue.oldest_due_seconds),
                    _recently(queue.completed_recently),
                    _recently(queue.failed_recently),
                ]
            )
        lines.append(
            table(
                [
                    "QUEUE",
                    "PAUSED",
                    *(state.value.upper() for state in SHOWN_STATES),
                    "OLDEST DUE",
                    "COMPLETED 1/5/15M",
                    "FAILED 1/5/15M",
                ],
                rows,
            )
        )
        if any(queue.estimated for queue in status.queues):
            lines.append("≈ estimated: more jobs than are counted exactly")
        lines.append(
            "COMPLETED and FAILED 1/5/15M: jobs finished within the last 1, 5 and 15 minutes"
        )
    else:
        lines.append("No queues yet.")
    lines.append("")
    leader = status.leader
    if leader is None:
        lines.append("Leader: none ever elected")
    else:
        held = "active" if leader["active"] else "LAPSED"
        lines.append(
            f"Leader: {leader['worker']}, elected {cell(leader['elected_at'])}, lease until "
            f"{cell(leader['expires_at'])} ({held})"
        )
    running = sum(worker["status"] == "running" for worker in status.workers)
    lost = sum(worker["status"] == "lost" for worker in status.workers)
    lines.append(
        f"Workers: {running} running, {lost} lost, {status.workers_stopped} stopped "
        f"(kept for WORKER_RETENTION)"
    )
    if status.workers:
        lines.append(
            table(
                ["WORKER", "STATUS", "QUEUES", "CONCURRENCY", "RUNNING", "LEADER", "SEEN"],
                [
                    [
                        worker["id"],
                        worker["status"],
                        ", ".join(worker["queues"])
                        if isinstance(worker["queues"], list)
                        else "all",
                        worker["concurrency"],
                        worker["running"],
                        worker["leader"],
                        ago(worker["seen_seconds_ago"]) + " ago",
                    ]
                    for worker in status.workers
                ],
            )
        )
    if status.problems:
        lines += ["", *(f"Unhealthy: {problem}" for problem in status.problems)]
    return "\n".join(lines)


def show(stdout: Any, *, as_json: bool) -> int:
    status = read_status()
    stdout.write(to_json(as_data(status)) if as_json else render(status))
    return OK if status.healthy else NOTHING


def watch(stdout: Any, *, as_json: bool, seconds: float) -> int:
    """Show the status every ``seconds`` until interrupted: redrawn in place on a terminal,
    one after the other elsewhere (with --json, one document per line)."""
    in_place = not as_json and stdout.isatty()
    try:
        while True:
            status = read_status()
            if as_json:
                stdout.write(to_json(as_data(status), one_line=True))
            elif in_place:
                stdout.write("\x1b[H\x1b[2J" + render(status))
            else:
                stdout.write(render(status) + "\n")
            stdout.flush()
            time.sleep(seconds)
    except KeyboardInterrupt:
        return OK
