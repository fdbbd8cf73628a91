"""``python manage.py eddyq_health``: a probe, for Kubernetes' exec probes and for scripts.

Exits 0 with one line on stdout (``ok: ...``, what was checked) when every check passes, 1 with
one line on stderr (``unhealthy: ...``, what failed) when one fails, and 2 on bad usage. The
checks: the database answers (always); ``--worker``: a worker of this host is alive, not stopped
and seen within STALE_AFTER by the database's clock; ``--leader``: a worker holds the leader
lease; ``--max-latency``: no queue's oldest due available job has waited longer.

A probe must never hang: the connection and each statement are bounded by ``--timeout``, and a
watchdog ends the process once it has passed, whatever it was waiting for.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandParser
from django.db import Error as DatabaseError
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_eddyq import inspection, sql
from django_eddyq.conf import eddyq_settings
from django_eddyq.durations import format_duration, parse_duration
from django_eddyq.models import Queue, WorkerProcess

UNHEALTHY = 1
#: The queues named in a line, at most; the others are counted.
QUEUES_NAMED = 5


def duration(value: str) -> timedelta:
    try:
        return parse_duration(value, name="DURATION")
    except ValueError as error:
        # argparse names the option.
        raise argparse.ArgumentTypeError(str(error).removeprefix("DURATION: ")) from None


def positive_duration(value: str) -> timedelta:
    parsed = duration(value)
    if not parsed:
        raise argparse.ArgumentTypeError(f"{value!r} is zero; it must be longer")
    return parsed


def age(seconds: float) -> str:
    """A wait or an age, for the line: tenths of a second under 10 s, then whole units."""
    if math.isinf(seconds):
        return "forever"
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.1f}s"
    return format_duration(timedelta(seconds=round(seconds)))


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


class Unhealthy(Exception):
    """A check failed; the message says what, for the line."""


class DatabaseDown(Unhealthy):
    """The database did not answer."""


class Command(BaseCommand):
    help = (
        "Check that the queue is healthy, for Kubernetes exec probes: exit 0 and print one "
        "'ok: ...' line, or exit 1 and print one 'unhealthy: ...' line saying what failed "
        "(2 on bad usage). Always checks that the database answers; add --worker, --leader "
        "and --max-latency for more."
    )

    # A probe answers whatever the system checks would say, and quickly.
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django's own attribute

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--worker",
            action="store_true",
            help="A worker of this host (socket.gethostname()) is alive: not stopped, and seen "
            "within STALE_AFTER by the database's clock.",
        )
        parser.add_argument(
            "--host",
            metavar="NAME",
            default=None,
            help="With --worker (implied), check the workers of this host instead.",
        )
        parser.add_argument(
            "--leader",
            action="store_true",
            help="A worker holds the leader lease, running maintenance.",
        )
        parser.add_argument(
            "--max-latency",
            type=duration,
            metavar="DURATION",
            default=None,
            help="No queue's oldest due available job has waited longer than this (like 30s, "
            "5m); paused queues are left out.",
        )
        parser.add_argument(
            "--timeout",
            type=positive_duration,
            metavar="DURATION",
            default=timedelta(seconds=5),
            help="The longest the probe takes: connecting, each statement, and all of it "
            "(default: 5s). Set the probe's own timeout a few seconds longer.",
        )
        parser.add_argument(
            "--database-down-ok",
            action="store_true",
            help="Exit 0 (saying so) when the database does not answer: for a liveness probe, "
            "so that a database outage does not restart every pod.",
        )
        parser.add_argument(
            "--database",
            metavar="ALIAS",
            default=None,
            help="The database alias of the queue (default: EDDYQ's DATABASE).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        timeout: timedelta = options["timeout"]
        self._lock = threading.Lock()
        self._answered = False
        self._phase = "reading the settings"
        self._database_down_ok = bool(options["database_down_ok"])
        watchdog = threading.Timer(timeout.total_seconds(), self._give_up, args=(timeout,))
        watchdog.daemon = True
        watchdog.start()
        try:
            passed, failed = self._check(options, timeout)
        except DatabaseDown as down:
            if self._database_down_ok:
                self._answer(f"ok: {down}, so nothing else was checked (--database-down-ok)")
                return
            self._answer(f"unhealthy: {down}", healthy=False)
        except Unhealthy as problem:
            self._answer(f"unhealthy: {problem}", healthy=False)
        finally:
            watchdog.cancel()
        if failed:
            self._answer(f"unhealthy: {'; '.join(failed)}", healthy=False)
        self._answer(f"ok: {'; '.join(passed)}")

    def _answer(self, line: str, *, healthy: bool = True) -> None:
        """Print the line, once (the watchdog may be about to print its own), and exit 1 if
        unhealthy."""
        with self._lock:
            if self._answered:
                return
            self._answered = True
            (self.stdout if healthy else self.stderr).write(line)
        if not healthy:
            raise SystemExit(UNHEALTHY)

    def _give_up(self, timeout: timedelta) -> None:
        """The watchdog: past --timeout, whatever the main thread waits for, answer and exit.
        The main thread may be blocked in the C library: the process ends with os._exit."""
        with self._lock:
            if self._answered:
                return
            self._answered = True
            waited = f"no answer within {format_duration(timeout)} (--timeout) {self._phase}"
            down = self._phase.startswith("connecting") and self._database_down_ok
            if down:
                line, stream, code = f"ok: {waited} (--database-down-ok)\n", 1, 0
            else:
                line, stream, code = f"unhealthy: {waited}\n", 2, UNHEALTHY
            os.write(stream, line.encode())
            os._exit(code)

    def _check(self, options: dict[str, Any], timeout: timedelta) -> tuple[list[str], list[str]]:
        """Run the checks asked for, in one transaction bounded by the timeout: what passed and
        what failed, each a phrase for the line. Raises DatabaseDown if the database does not
        answer, Unhealthy if a check cannot be made."""
        try:
            alias = options["database"] or eddyq_settings.DATABASE
            stale_after = eddyq_settings.STALE_AFTER
        except ImproperlyConfigured as error:
            raise Unhealthy(f"the settings are invalid: {first_line(error)}") from None
        if alias not in connections:
            raise Unhealthy(f"no database {alias!r} in DATABASES")
        host = options["host"]
        if options["worker"] and host is None:
            host = socket.gethostname()
        checks: list[tuple[str, Callable[[], str]]] = []
        if host is not None:
            worker_host: str = host
            checks.append(
                (
                    f"checking the workers of host {host}",
                    lambda: self._worker(alias, worker_host, stale_after),
                )
            )
        if options["leader"]:
            checks.append(("checking the leader", lambda: self._leader(alias)))
        if options["max_latency"] is not None:
            bound: timedelta = options["max_latency"]
            checks.append(("checking the queues' latency", lambda: self._latency(alias, bound)))

        milliseconds = max(int(timeout.total_seconds() * 1000), 1)
        connection = connections[alias]
        # The connection gives up after the timeout too (libpq takes whole seconds), not the
        # minutes a dropped packet can take: for this connection, while the checks run.
        settings_dict = connection.settings_dict
        connection.settings_dict = {
            **settings_dict,
            "OPTIONS": {
                **settings_dict.get("OPTIONS", {}),
                "connect_timeout": max(math.ceil(timeout.total_seconds()), 1),
            },
        }
        try:
            return self._run_checks(connection, alias, checks, milliseconds)
        finally:
            connection.settings_dict = settings_dict

    def _run_checks(
        self,
        connection: BaseDatabaseWrapper,
        alias: str,
        checks: list[tuple[str, Callable[[], str]]],
        milliseconds: int,
    ) -> tuple[list[str], list[str]]:
        """Connect, see the database answer, then run each check (a phase for the watchdog's
        line, and a function returning what passed or raising Unhealthy), in one transaction
        whose statements time out after ``milliseconds``."""
        connecting = f"connecting to database {alias}"
        self._phase = connecting
        passed: list[str] = []
        failed: list[str] = []
        started = time.monotonic()
        try:
            connection.ensure_connection()
            with transaction.atomic(using=alias), connection.cursor() as cursor:
                cursor.execute(sql.SET_LOCAL_STATEMENT_TIMEOUT, {"timeout": str(milliseconds)})
                cursor.execute(sql.DATABASE_NOW)
                took = (time.monotonic() - started) * 1000
                passed.append(f"database {alias} answers ({took:.0f} ms)")
                for phase, check in checks:
                    self._phase = phase
                    try:
                        passed.append(check())
                    except Unhealthy as problem:
                        failed.append(str(problem))
        except DatabaseError as error:
            if self._phase == connecting:
                raise DatabaseDown(
                    f"database {alias} does not answer: {first_line(error)}"
                ) from None
            raise Unhealthy(f"{self._phase} failed: {first_line(error)}") from None
        return passed, failed

    def _worker(self, alias: str, host: str, stale_after: timedelta) -> str:
        workers = inspection.with_worker_status(
            WorkerProcess.objects.using(alias).filter(host=host), stale_after
        )
        # A live one if there is any, else the one seen last.
        best = (
            workers.order_by("status_order", "-last_seen_at")
            .values_list("id", "status", "seen_ago")
            .first()
        )
        if best is None:
            raise Unhealthy(f"no worker on host {host}: none has registered from it")
        worker_id, status, seen_ago = best
        seen = age(seen_ago.total_seconds())
        if status == "stopped":
            raise Unhealthy(f"no live worker on host {host}: worker {worker_id} stopped {seen} ago")
        if status == "lost":
            raise Unhealthy(
                f"no live worker on host {host}: worker {worker_id} last seen {seen} ago "
                f"(STALE_AFTER {format_duration(stale_after)})"
            )
        return f"worker {worker_id} on {host} seen {seen} ago"

    def _leader(self, alias: str) -> str:
        leader = inspection.Overview(using=alias).leader
        if leader is None:
            raise Unhealthy("no leader: none has ever been elected")
        if not leader.active:
            raise Unhealthy(
                f"no leader: the lease of the last, {leader.leader_id}, ended at "
                f"{leader.expires_at.isoformat(timespec='seconds')}"
            )
        return f"leader {leader.leader_id}"

    def _latency(self, alias: str, bound: timedelta) -> str:
        latencies = inspection.queue_latencies(alias)
        limit = bound.total_seconds()
        over = {queue: seconds for queue, seconds in latencies.items() if seconds > limit}
        if over:
            paused = Queue.objects.using(alias).filter(name__in=over, paused_at__isnull=False)
            for name in paused.values_list("name", flat=True):
                del over[name]
        bound_text = format_duration(bound)
        if over:
            worst = sorted(over.items(), key=lambda item: (-item[1], item[0]))
            named = ", ".join(f"{queue} {age(seconds)}" for queue, seconds in worst[:QUEUES_NAMED])
            more = f" and {len(worst) - QUEUES_NAMED} more" if len(worst) > QUEUES_NAMED else ""
            noun = "queue" if len(worst) == 1 else "queues"
            raise Unhealthy(
                f"the oldest due job waited longer than --max-latency {bound_text} in {noun} "
                f"{named}{more}"
            )
        if not latencies:
            return f"no due job waits (--max-latency {bound_text})"
        queue, seconds = max(latencies.items(), key=lambda item: (item[1], item[0]))
        return (
            f"no queue's oldest due job waited longer than {bound_text} "
            f"(longest: {queue}, {age(seconds)}{', paused' if seconds > limit else ''})"
        )
