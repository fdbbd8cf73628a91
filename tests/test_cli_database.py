"""``manage.py eddyq`` with the jobs in a database of their own (``EDDYQ["DATABASE"]``): every
subcommand reads and changes that database, never ``default``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from django_eddyq.models import Job, Queue
from tests.processes import MANAGE

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue_database(worker_environment: dict[str, str]) -> Iterator[dict[str, str]]:
    """A database of its own for the jobs, migrated; the environment that points
    ``EDDYQ["DATABASE"]`` at it. Dropped at the end."""
    url = urlsplit(worker_environment["DATABASE_URL"])
    name = f"{url.path.lstrip('/')}_queue"
    server = urlunsplit(url._replace(path="/postgres"))
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    environment = {
        **worker_environment,
        "QUEUE_DATABASE_URL": urlunsplit(url._replace(path=f"/{name}")),
        "EDDYQ_DATABASE": "queue",
    }
    try:
        manage(environment, "migrate", "--database", "queue", "--verbosity", "0")
        yield environment
    finally:
        with psycopg.connect(server, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def manage(
    environment: dict[str, str], *arguments: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=check,
    )


def test_the_command_line_works_on_the_queue_database(queue_database: dict[str, str]) -> None:
    enqueued = manage(
        queue_database,
        "shell",
        "-c",
        "from tests.jobs import add; print(add.using(queue='elsewhere').enqueue(2, 3).id)",
    )
    job_id = int(enqueued.stdout.split()[-1])  # after the shell's own notes
    assert not Job.all_objects.using("default").filter(pk=job_id).exists()

    shown = manage(queue_database, "eddyq", "job", str(job_id), "--json")
    job: dict[str, Any] = json.loads(shown.stdout)
    assert (job["id"], job["task"], job["queue"]) == (job_id, "tests.jobs.add", "elsewhere")

    status = manage(queue_database, "eddyq", "status", "--json", check=False)
    assert status.returncode == 1, status.stderr  # no worker runs: unhealthy, but it answers
    queues = {queue["name"]: queue for queue in json.loads(status.stdout)["queues"]}
    assert queues["elsewhere"]["jobs"]["available"] == 1

    manage(queue_database, "eddyq", "pause", "elsewhere")
    assert not Queue.objects.using("default").filter(name="elsewhere").exists()
    status = manage(queue_database, "eddyq", "status", "--json", check=False)
    queues = {queue["name"]: queue for queue in json.loads(status.stdout)["queues"]}
    assert queues["elsewhere"]["paused"] is True
