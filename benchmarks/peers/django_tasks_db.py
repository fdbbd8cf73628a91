"""django-tasks-db (https://github.com/RealOrangeOne/django-tasks-db) as a benchmark subject.

The database backend of Django's own tasks framework (``django.tasks``). Set up per its docs:
``django_tasks_db`` in INSTALLED_APPS, ``TASKS = {"default": {"BACKEND":
"django_tasks_db.DatabaseBackend"}}``, ``migrate`` (benchmarks/peers/django_tasks_db_settings.py).
Enqueued with ``task.enqueue()``; ``django.tasks`` has no bulk API, so "many" is ``enqueue()`` in
a loop inside one ``transaction.atomic()``. The worker is ``manage.py db_worker`` at its defaults
(one task at a time, 1 s polling interval) but for ``--no-startup-delay``; with ``--batch`` for a
drain (it exits once no task is left). ``finished_at`` is the completion time.

No options (``OPTIONS`` has empty sets): ``db_worker`` documents no setting for throughput. It
runs one task at a time; its other flags choose queues and a backend, the polling interval
(which a ``--batch`` worker with tasks waiting does not sleep), a task limit and reloading.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from benchmarks import common, harness

SETTINGS = "benchmarks.peers.django_tasks_db_settings"
TABLE = "django_tasks_database_dbtaskresult"

#: Option sets by name (``run.py --peer-options``): none to choose.
OPTIONS: dict[str, dict[str, Any]] = {"defaults": {}, "best": {}}


def setup_django() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django

    django.setup()


class DjangoTasksDb(harness.Subject):
    name = "django-tasks-db"
    worker_exits = True
    tables = (TABLE,)

    def setup(self) -> None:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def reset(self) -> None:
        self.connection.execute(f"TRUNCATE {TABLE}")

    def enqueue_single(self, n: int) -> None:
        from benchmarks.peers.django_tasks_db_tasks import noop

        for _ in range(n):
            noop.enqueue()

    def enqueue_many(self, n: int, chunk: int) -> None:
        from django.db import transaction

        from benchmarks.peers.django_tasks_db_tasks import noop

        for start in range(0, n, chunk):
            with transaction.atomic():
                for _ in range(min(chunk, n - start)):
                    noop.enqueue()

    def enqueue_probe(self, key: int) -> None:
        from benchmarks.peers.django_tasks_db_tasks import probe

        probe.enqueue(key)

    def worker_argv(self, mode: str, options: dict[str, Any]) -> list[str]:
        argv = [sys.executable, "-m", "django", "db_worker", "--no-startup-delay", "--no-reload"]
        if mode == "drain":
            argv.append("--batch")
        return argv

    def count(self) -> int:
        return self.scalar(f"SELECT count(*) FROM {TABLE}")

    def pending(self) -> int:
        return self.scalar(f"SELECT count(*) FROM {TABLE} WHERE status IN ('READY', 'RUNNING')")

    def completed(self) -> int:
        return self.scalar(f"SELECT count(*) FROM {TABLE} WHERE status = 'SUCCESSFUL'")

    def last_completion(self) -> float | None:
        return self.scalar(
            f"SELECT extract(epoch FROM max(finished_at))::float8 FROM {TABLE}"
            " WHERE status = 'SUCCESSFUL'"
        )


def subject() -> DjangoTasksDb:
    setup_django()
    return DjangoTasksDb(os.environ["DATABASE_URL"], dict(os.environ))


def setup(config: dict[str, Any]) -> dict[str, Any]:
    queue = subject()
    queue.setup()
    queue.close()
    return {"ok": True, "options": harness.chosen_options(OPTIONS, config)}


def run_round(config: dict[str, Any]) -> dict[str, Any]:
    return harness.standard_round(subject(), config)


if __name__ == "__main__":
    common.subject_main({"setup": setup, "round": run_round})
