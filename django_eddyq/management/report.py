"""What ``eddyq_worker`` and ``eddyq_maintenance`` print on stdout, whatever ``LOGGING`` says.

A banner as they start (what runs, against which database, how it wakes), a line per worker
started and stopped, and at ``-v 2`` a line per finished job. ``-v 0`` prints none of it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import OutputWrapper

from django_eddyq import __version__
from django_eddyq.conf import eddyq_settings
from django_eddyq.durations import format_duration


def database_description(alias: str) -> str:
    """``alias: user@host:port/name``, from the settings: never the password."""
    database = settings.DATABASES.get(alias, {})
    host = database.get("HOST") or "local socket"
    port = f":{database['PORT']}" if database.get("PORT") else ""
    user = f"{database['USER']}@" if database.get("USER") else ""
    return f"{alias}: {user}{host}{port}/{database.get('NAME', '')}"


def wake_ups() -> str:
    poll = format_duration(eddyq_settings.POLL_INTERVAL)
    if eddyq_settings.LISTEN_NOTIFY:
        return f"LISTEN/NOTIFY, and a poll every {poll}"
    return f"a poll every {poll} (LISTEN_NOTIFY is off)"


class Report:
    """Lines for a command's stdout, at the command's verbosity."""

    def __init__(self, out: OutputWrapper, verbosity: int) -> None:
        self.out = out
        self.verbosity = verbosity

    def write(self, line: str, *, level: int = 1) -> None:
        if self.verbosity >= level:
            self.out.write(line)

    def worker_banner(
        self,
        *,
        queues: list[str] | None,
        concurrency: int,
        processes: int,
        burst: bool,
        maintenance: bool,
        max_jobs: int | None = None,
        max_memory: int | None = None,
        reload: bool = False,
    ) -> None:
        limits = [
            *([f"after {max_jobs} jobs"] if max_jobs is not None else []),
            *([f"at {max_memory} MiB"] if max_memory is not None else []),
        ]
        self.write(
            f"django-eddyq {__version__}: eddyq_worker on {socket.gethostname()}, "
            f"pid {os.getpid()}\n"
            f"  queues: {', '.join(queues) if queues else 'all'}; concurrency {concurrency}; "
            f"processes {processes}{'; burst' if burst else ''}\n"
            + (f"  each process replaced {' or '.join(limits)}\n" if limits else "")
            + ("  restarts when its code changes\n" if reload else "")
            + f"  database {database_description(eddyq_settings.DATABASE)}\n"
            f"  wakes on {wake_ups()}\n"
            f"  maintenance: "
            + ("on (takes part in the leader election)" if maintenance else "off")
        )

    def maintenance_banner(self, services: list[str], *, dry_run: bool) -> None:
        dry = " (dry run: nothing is changed)" if dry_run else ""
        self.write(
            f"django-eddyq {__version__}: eddyq_maintenance on {socket.gethostname()}, "
            f"pid {os.getpid()}\n"
            f"  database {database_description(eddyq_settings.DATABASE)}\n"
            f"  services: {', '.join(services)}{dry}"
        )

    def worker_started(self, sender: Any, worker: Any, **kwargs: Any) -> None:
        """A receiver of ``signals.worker_started``."""
        self.write(f"worker {worker.id} started (pid {os.getpid()})")

    def code_changed(self, path: Path) -> None:
        self.write(f"{path} changed: restarting once the running jobs have ended")

    def worker_stopped(self, worker: Any) -> None:
        left = f", {len(worker.abandoned)} left to the rescuer" if worker.abandoned else ""
        why = f" to be replaced, as {worker.recycled}" if worker.recycled else ""
        self.write(
            f"worker {worker.id} stopped{why}: {worker.finished} jobs finished, "
            f"{worker.handed_back} handed back{left}"
        )

    def job_finished(
        self,
        sender: Any,
        job: Any,
        outcome: str,
        duration: float | None,
        **kwargs: Any,
    ) -> None:
        """A receiver of ``signals.job_finished``, at ``-v 2``."""
        took = "" if duration is None else f" in {duration * 1000:.1f} ms"
        self.write(
            f"job {job.id} {job.task} (queue {job.queue}, attempt {job.attempt}): {outcome}{took}",
            level=2,
        )
