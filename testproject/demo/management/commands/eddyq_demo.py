"""``manage.py eddyq_demo``: migrate, enqueue sample jobs, serve the admin and run a worker."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from demo import tasks

ADMIN_USER = "admin"
ADMIN_PASSWORD = "admin"


def free_port(preferred: int) -> int:
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", preferred)) != 0:
            return preferred
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Command(BaseCommand):
    help = "Run the django-eddyq demo: sample jobs, the admin and a worker (Ctrl-C stops it)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="Port of the admin server.")
        parser.add_argument(
            "--burst", action="store_true", help="Stop once the sample jobs are worked off."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", verbosity=0)
        self._ensure_admin_user()
        self._enqueue_samples()

        port = free_port(options["port"])
        manage = Path(sys.argv[0]).resolve()
        server = subprocess.Popen(
            [sys.executable, str(manage), "runserver", f"127.0.0.1:{port}", "--noreload"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.stdout.write(
            self.style.SUCCESS(
                f"\nThe admin is at http://127.0.0.1:{port}/admin/django_eddyq/job/ "
                f"(user {ADMIN_USER!r}, password {ADMIN_PASSWORD!r}).\n"
                "Failed jobs: filter by state 'failed'. Ctrl-C stops the worker and the server.\n"
            )
        )
        try:
            worker_options = ["--concurrency", "4"] + (["--burst"] if options["burst"] else [])
            call_command("eddyq_worker", *worker_options)
        finally:
            server.terminate()
            server.wait(10)

    def _ensure_admin_user(self) -> None:
        users = get_user_model()
        if not users.objects.filter(username=ADMIN_USER).exists():
            users.objects.create_superuser(ADMIN_USER, "admin@example.com", ADMIN_PASSWORD)

    def _enqueue_samples(self) -> None:
        tasks.send_welcome_email.enqueue_many([(user_id,) for user_id in range(1, 21)])
        tasks.build_report.enqueue_many([("daily",), {"name": "weekly", "rows": 700}])
        tasks.flaky_sync.enqueue_many([(f"acct-{n}",) for n in range(5)])
        tasks.always_fails.enqueue("the payment provider is down")
        tasks.reject_bad_input.enqueue({"name": "no email"})
        self.stdout.write("Enqueued 29 sample jobs, some of which fail on purpose.")
