"""``python manage.py eddyq SUBCOMMAND``: see and steer the queue from a terminal or a script.

Tables for people, ``--json`` for scripts; exit status 0 when done, 1 when nothing matched or
the queue is unhealthy, 2 on bad usage. The subcommands live in ``django_eddyq.management.cli``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_eddyq.bulk import BATCH_SIZE
from django_eddyq.management.cli import changes, jobs, periodic, queues, status, workflows
from django_eddyq.management.cli.filters import add_filter_arguments, job_filter, queue_name
from django_eddyq.management.cli.output import USAGE, Usage


def job_id(value: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 2**63:
        raise argparse.ArgumentTypeError(f"{value!r} is not a job id (a positive integer)")
    return int(value)


def workflow_id(value: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 2**63:
        raise Usage(f"{value!r} is not a workflow id (a positive integer)")
    return int(value)


def step_limit(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= workflows.MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{value!r}: give 1 to {workflows.MAX_LIMIT:,} steps")
    return int(value)


def listing_limit(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= jobs.MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{value!r}: give 1 to {jobs.MAX_LIMIT:,} jobs")
    return int(value)


def batch_size(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 10_000:
        raise argparse.ArgumentTypeError(f"{value!r}: give 1 to 10,000 jobs a batch")
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
        "resume, periodic, workflow. Each subcommand has --help; --json prints JSON for "
        "scripts. Exit status: 0 done, 1 nothing matched or unhealthy, 2 bad usage."
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

        listed = add(
            "jobs",
            help="The newest jobs of a filter, a line each.",
            description="The newest jobs matching every filter given, newest first: id, "
            "task, state, queue, attempt, when enqueued and finished, the last error's first "
            "line. Matches are not counted: past --limit, it says more match. Exits 1 when "
            "no job matches.",
        )
        add_filter_arguments(listed)
        listed.add_argument(
            "--limit",
            type=listing_limit,
            default=50,
            help="List at most this many jobs (default 50).",
        )

        for name, rule in (
            ("retry", "failed, cancelled, retryable and scheduled jobs become available now"),
            ("cancel", "waiting jobs are cancelled at once, running ones asked to stop"),
            ("delete", "ended jobs (completed, failed, cancelled) are deleted"),
        ):
            bulk = add(
                name,
                help=f"{name.capitalize()} jobs by id, or every job of a filter.",
                description=f"{name.capitalize()} the jobs given by id, or every job matching "
                f"the filters ({rule}; the others are left alone), in batches of short "
                "transactions. Asks first on a terminal; --yes to go ahead without asking "
                "(needed without a terminal). Exits 1 when no job matches.",
            )
            bulk.add_argument("ids", nargs="*", type=job_id, metavar="ID", help="Job ids.")
            add_filter_arguments(bulk)
            bulk.add_argument(
                "--all",
                action="store_true",
                help=f"{name.capitalize()} every job the rule allows, without ids or filter.",
            )
            bulk.add_argument(
                "--dry-run", action="store_true", help="Count what would change; change nothing."
            )
            bulk.add_argument("--yes", action="store_true", help="Do not ask; go ahead.")
            bulk.add_argument(
                "--batch-size",
                type=batch_size,
                default=BATCH_SIZE,
                help=f"Jobs per batch, each its own transaction (default {BATCH_SIZE:,}).",
            )

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

        workflow = add(
            "workflow",
            help="A workflow's steps; retry its failed steps, or cancel it.",
            description="'workflow ID': the workflow's counts and its steps by job id (a step "
            "comes after those it runs after), each with its state, attempts, duration and "
            "the steps it runs after. "
            "'workflow retry ID' retries its failed steps (the steps they cancelled come back, "
            "waiting for them); 'workflow cancel ID' cancels its unfinished steps (running ones "
            "are asked to stop). Both ask first on a terminal; --yes to go ahead without asking "
            "(needed without a terminal). Exits 1 for an unknown ID, or when there is nothing "
            "to retry or cancel.",
        )
        workflow.add_argument(
            "words", nargs="+", metavar="[ACTION] ID", help="retry or cancel, then the id."
        )
        workflow.add_argument(
            "--limit",
            type=step_limit,
            default=workflows.DEFAULT_LIMIT,
            help=f"List at most this many steps (default {workflows.DEFAULT_LIMIT}).",
        )
        workflow.add_argument("--yes", action="store_true", help="Do not ask; go ahead.")

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
        if subcommand == "jobs":
            return jobs.list_jobs(
                self.stdout,
                self.stderr,
                job_filter(options),
                limit=options["limit"],
                as_json=as_json,
            )
        if subcommand in changes.CHANGES:
            return changes.change(
                subcommand,
                job_filter(options, ids=tuple(options["ids"])),
                stdout=self.stdout,
                stderr=self.stderr,
                stdin=sys.stdin,
                every=options["all"],
                dry_run=options["dry_run"],
                yes=options["yes"],
                batch_size=options["batch_size"],
                as_json=as_json,
            )
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
        if subcommand == "workflow":
            return self.workflow(options["words"], options)
        raise Usage(f"unknown subcommand {subcommand!r}")

    def workflow(self, words: list[str], options: dict[str, Any]) -> int:
        """``workflow ID`` or ``workflow ACTION ID``."""
        if words[0] in workflows.ACTIONS:
            action, ids = words[0], words[1:]
            if len(ids) != 1:
                raise Usage(f"workflow {action} takes the ID of one workflow")
            return workflows.steer(
                self.stdout,
                self.stderr,
                action,
                workflow_id(ids[0]),
                stdin=sys.stdin,
                yes=options["yes"],
                as_json=options["json"],
            )
        actions = " or ".join(workflows.ACTIONS)
        if len(words) != 1:
            raise Usage(f"workflow takes one ID, or an ACTION ({actions}) and an ID")
        if not words[0].isdigit():
            raise Usage(f"{words[0]!r} is neither a workflow id nor an ACTION ({actions})")
        return workflows.show(
            self.stdout,
            self.stderr,
            workflow_id(words[0]),
            limit=options["limit"],
            as_json=options["json"],
        )
