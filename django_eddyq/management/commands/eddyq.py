"""``python manage.py eddyq SUBCOMMAND``: see and steer the queue from a terminal or a script.

Tables for people, ``--json`` for scripts; exit status 0 when done, 1 when nothing matched or
the queue is unhealthy, 2 on bad usage. The subcommands live in ``django_eddyq.management.cli``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_eddyq.management.cli import jobs, periodic, queues, status
from django_eddyq.management.cli.output import USAGE, Usage
from django_eddyq.vocabulary import validate_queue_name


def queue_name(value: str) -> str:
    try:
        return validate_queue_name(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def job_id(value: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 2**63:
        raise argparse.ArgumentTypeError(f"{value!r} is not a job id (a positive integer)")
    return int(value)


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0.1 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"{value!r}: give 0.1 to 3600 seconds")
    return seconds


class Command(BaseCommand):
    help = (
        "See and steer the eddyq queue: status, jobs, job, retry, cancel, delete, pause, "
        "resume, periodic. Each subcommand has --help; --json prints JSON for scripts. Exit "
        "status: 0 done, 1 nothing matched or unhealthy, 2 bad usage."
    )
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django's own attribute

    def add_arguments(self, parser: CommandParser) -> None:
        subcommands = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)

        def add(name: str, **kwargs: Any) -> CommandParser:
            subcommand: CommandParser = subcommands.add_parser(name, **kwargs)
            subcommand.add_argument("--json", action="store_true", help="Print JSON, for scripts.")
            return subcommand

        shown = add(
            "status",
            help="Each queue's jobs per state and oldest due job; the leader; the workers.",
            description="Each queue's jobs per state (estimated past 10,000 where counting "
            "would be slow) and how long its oldest due job has waited; the leader; the "
            "workers. Exits 1 when no worker runs or no leader holds the lease.",
        )
        shown.add_argument(
            "--watch",
            type=positive_seconds,
            metavar="SECONDS",
            help="Refresh every SECONDS until Ctrl-C (in place on a terminal).",
        )

        one = add("job", help="One job: arguments, result, every attempt.")
        one.add_argument("id", type=job_id, help="The job's id.")

        for name, verb in (("pause", "Pause"), ("resume", "Resume")):
            subcommand = add(
                name,
                help=f"{verb} queues: workers "
                + ("take no more of their jobs." if name == "pause" else "take their jobs again."),
            )
            subcommand.add_argument("queues", nargs="+", type=queue_name, metavar="QUEUE")

        schedules = add(
            "periodic",
            help="The periodic schedules: next and last run; run one now, enable, disable.",
            description="Without ACTION: every periodic schedule (EDDYQ['PERIODIC'] and "
            "@task(cron=...)) with its next run by the database's clock, its last run and that "
            "run's job. 'run NAME' enqueues one run now (the schedule's own runs go on as "
            "before) and prints its job's id; 'disable NAME' stops its runs until 'enable "
            "NAME', which resumes from its next run. Exits 1 for an unknown NAME, or when no "
            "schedule is configured.",
        )
        schedules.add_argument("action", nargs="?", choices=periodic.ACTIONS, metavar="ACTION")
        schedules.add_argument("name", nargs="?", metavar="NAME", help="A schedule's name.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            code = self.run(options)
        except Usage as error:
            raise CommandError(str(error), returncode=USAGE) from None
        except status.DatabaseUnreadable as error:
            raise CommandError(f"cannot read the queue's database: {error}") from None
        if code:
            sys.exit(code)

    def run(self, options: dict[str, Any]) -> int:
        subcommand = options["subcommand"]
        as_json = options["json"]
        if subcommand == "status":
            if options["watch"] is not None:
                return status.watch(self.stdout, as_json=as_json, seconds=options["watch"])
            return status.show(self.stdout, as_json=as_json)
        if subcommand == "job":
            return jobs.show_job(self.stdout, self.stderr, options["id"], as_json=as_json)
        if subcommand in ("pause", "resume"):
            return queues.set_paused(
                self.stdout, options["queues"], paused=subcommand == "pause", as_json=as_json
            )
        if subcommand == "periodic":
            if options["action"] is None:
                if options["name"] is not None:
                    raise Usage("periodic takes an ACTION before the NAME")
                return periodic.show(self.stdout, self.stderr, as_json=as_json)
            return periodic.steer(
                self.stdout, self.stderr, options["action"], options["name"], as_json=as_json
            )
        raise Usage(f"unknown subcommand {subcommand!r}")
