"""``python manage.py eddyq_worker``: run jobs until stopped."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_eddyq import metrics, registry, signals
from django_eddyq.conf import eddyq_settings
from django_eddyq.management.report import Report
from django_eddyq.vocabulary import validate_positive_int, validate_queue_name
from django_eddyq.worker import Worker, reloading
from django_eddyq.worker.recycling import resident_mib
from django_eddyq.worker.signals import handle_signals, stop_signal_actions
from django_eddyq.worker.worker import STUCK_EXIT_CODE, run_in_this_process

if TYPE_CHECKING:
    from django_eddyq.worker.supervisor import Supervisor


def queue_list(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise ValueError("no queue names given")
    return [validate_queue_name(name) for name in names]


def positive_int(value: str) -> int:
    return validate_positive_int(int(value), "the value")


def port_number(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise ValueError(f"{port} is not a port number (0 to 65535)")
    return port


class Command(BaseCommand):
    help = (
        "Run eddyq jobs: claim, run and record them until stopped (SIGTERM/SIGINT). Exits "
        f"with status {STUCK_EXIT_CODE} when every handler thread is stuck past its timeout, to be "
        "restarted."
    )

    # The checks run in handle() so that they run under call_command() too: a worker with
    # broken settings must never start.
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django's own attribute

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues",
            type=queue_list,
            default=None,
            help="Comma-separated queues to work on (default: all queues).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=10,
            help="Jobs run at once per process: sync ones on threads, async ones on an event "
            "loop (default: 10).",
        )
        parser.add_argument(
            "--processes",
            type=positive_int,
            default=1,
            help="Worker processes under one supervisor (default: 1, no supervisor).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Promote due jobs, work until no available job remains, then exit.",
        )
        parser.add_argument(
            "--no-maintenance",
            action="store_false",
            dest="maintenance",
            help="Never take part in the leader election that runs maintenance.",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            default=30.0,
            help="Seconds running jobs get to finish after a stop signal (default: 30).",
        )
        parser.add_argument(
            "--max-jobs",
            type=positive_int,
            default=None,
            help="Replace each worker process with a fresh one once it has taken this many jobs: "
            "it takes no more, lets its running jobs end, and exits (0 without --processes, for "
            "the process manager to start it again).",
        )
        parser.add_argument(
            "--max-memory",
            type=positive_int,
            default=None,
            metavar="MIB",
            help="Replace each worker process with a fresh one once its resident memory, checked "
            "as its jobs end, reaches this many MiB; as with --max-jobs.",
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help="For development: restart the worker when its code changes (Django's "
            "autoreloader), its running jobs given --shutdown-timeout to end first.",
        )
        parser.add_argument(
            "--metrics-port",
            type=port_number,
            default=None,
            help="Serve Prometheus metrics on this port, at /metrics, every worker process's "
            'combined; turns METRICS on. Needs pip install "django-eddyq[prometheus]".',
        )
        parser.add_argument(
            "--metrics-address",
            default="0.0.0.0",
            help="The address /metrics listens on (default: 0.0.0.0, every interface).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # With the queue's database, so that checks needing it (REINDEX_INDEXES) run too.
        alias = eddyq_settings.DATABASE
        self.check(
            databases=[alias] if alias in settings.DATABASES else None,
            display_num_errors=False,
        )
        if options["shutdown_timeout"] < 0:
            raise CommandError("--shutdown-timeout must not be negative")
        if options["reload"] and not reloading.in_child():
            # This process only restarts the one that works.
            code = reloading.run_parent()
            if code:
                raise SystemExit(code)
            return
        if options["max_memory"] is not None and options["max_memory"] <= resident_mib():
            raise CommandError(
                f"--max-memory {options['max_memory']} is not above the worker's size as it "
                f"starts, {resident_mib():.0f} MiB: every process would be replaced after each job"
            )
        # Imported once here, so that forked worker processes share them.
        registry.discover()
        # Before any worker process is forked, so that each counts its jobs.
        metrics_server = self.start_metrics(options)
        report = Report(self.stdout, options["verbosity"])
        report.worker_banner(
            queues=options["queues"],
            concurrency=options["concurrency"],
            processes=options["processes"],
            burst=options["burst"],
            maintenance=options["maintenance"],
            max_jobs=options["max_jobs"],
            max_memory=options["max_memory"],
            reload=options["reload"],
        )
        if metrics_server is not None and options["verbosity"] >= 1:
            self.stdout.write(f"  metrics: {metrics_server.url}")
        # Connected before any worker process is forked, so that each has them.
        signals.worker_started.connect(report.worker_started, weak=False)
        if options["verbosity"] >= 2:
            signals.job_finished.connect(report.job_finished, weak=False)

        def make_worker() -> Worker:
            return Worker(
                queues=options["queues"],
                concurrency=options["concurrency"],
                burst=options["burst"],
                shutdown_timeout=options["shutdown_timeout"],
                maintenance=options["maintenance"],
                max_jobs=options["max_jobs"],
                max_memory_mib=options["max_memory"],
            )

        if options["processes"] > 1:
            # Imported only here: multiprocessing is a few milliseconds of a worker's start.
            from django_eddyq.worker.supervisor import Supervisor

            self.supervise(
                Supervisor(options["processes"], make_worker, after=report.worker_stopped),
                options,
                report,
            )
        else:
            self.work(make_worker(), options, report)

    def supervise(self, supervisor: Supervisor, options: dict[str, Any], report: Report) -> None:
        if not options["reload"]:
            supervisor.run()
            return

        def restart(path: Path) -> None:
            report.code_changed(path)
            supervisor.stop()

        reloading.run_restarting_on_change(supervisor.run, on_change=restart)

    def work(self, worker: Worker, options: dict[str, Any], report: Report) -> None:
        handle_signals(stop_signal_actions(worker.stop, who=f"worker {worker.id}"))
        if not options["reload"]:
            run_in_this_process(worker, after=report.worker_stopped)
            return

        def restart(path: Path) -> None:
            report.code_changed(path)
            worker.recycle("its code changed", within=options["shutdown_timeout"])

        reloading.run_restarting_on_change(
            lambda: run_in_this_process(
                worker,
                after=report.worker_stopped,
                recycled_exit_code=reloading.RESTART_EXIT_CODE,
            ),
            on_change=restart,
        )

    def start_metrics(self, options: dict[str, Any]) -> metrics.Server | None:
        """Count jobs when METRICS or --metrics-port says so, and serve /metrics on the port."""
        port = options["metrics_port"]
        if port is None and not eddyq_settings.METRICS:
            return None
        try:
            return metrics.start_for_worker(port, options["metrics_address"], options["processes"])
        except ImproperlyConfigured as error:
            raise CommandError(str(error)) from None
        except OSError as error:  # the port is taken, the address is not this host's
            raise CommandError(
                f"Cannot serve metrics on {options['metrics_address']}:{port}: {error}"
            ) from None
