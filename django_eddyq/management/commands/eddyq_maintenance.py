"""``python manage.py eddyq_maintenance [SERVICE ...] [--dry-run]``: one pass of each, now."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from django_eddyq import registry
from django_eddyq.conf import eddyq_settings
from django_eddyq.maintenance import Reindexer, all_services
from django_eddyq.management.report import Report


class DryRunRollback(Exception):
    """Raised to roll a dry run's transaction back."""


class Command(BaseCommand):
    help = (
        "Run one pass of the named maintenance services (all by default) now, printing what "
        "each did. Safe beside running workers: every pass locks with SKIP LOCKED."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        names = [service.name for service in all_services()]
        parser.add_argument(
            "services", nargs="*", metavar="SERVICE", help=f"Any of: {', '.join(names)}."
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Report what each pass would change, and change nothing.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        registry.discover()
        services = {service.name: service for service in all_services()}
        unknown = [name for name in options["services"] if name not in services]
        if unknown:
            raise CommandError(
                f"Unknown service {', '.join(unknown)}; choose from {', '.join(services)}."
            )
        chosen = options["services"] or list(services)
        Report(self.stdout, options["verbosity"]).maintenance_banner(
            chosen, dry_run=options["dry_run"]
        )
        for name in chosen:
            service = services[name]
            if options["dry_run"]:
                self._dry_run(service)
            else:
                count = service.run_once()
                self.stdout.write(f"{name}: {count} {service.verb}")

    def _dry_run(self, service: Any) -> None:
        if isinstance(service, Reindexer):
            planned = service.planned()
            self.stdout.write(f"{service.name}: would run {'; '.join(planned) or 'nothing'}")
            return
        count = 0
        try:
            with transaction.atomic(using=eddyq_settings.DATABASE):
                count = service.run_once()
                raise DryRunRollback
        except DryRunRollback:
            pass
        self.stdout.write(f"{service.name}: would have {service.verb} {count} (dry run)")
