from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_eddyq.worker import Worker
from tests.processes import StartWorker, start_worker_processes

# Short timings so that tests of time-based behaviour stay fast.
FAST_SETTINGS: dict[str, Any] = {
    "POLL_INTERVAL": "50ms",
    "HEARTBEAT_INTERVAL": "1s",
    "STALE_AFTER": "5s",
}

# Fixtures that start real worker processes.
WORKER_PROCESS_FIXTURES = frozenset({"start_worker", "fleet"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts worker processes is marked ``processes``, however it starts them:
    CI's runs on the other Python and Django pairs leave those out."""
    for item in items:
        if WORKER_PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)


@pytest.fixture
def fast_settings() -> Iterator[None]:
    with override_settings(EDDYQ=FAST_SETTINGS):
        yield


@pytest.fixture
def run_burst_worker(fast_settings: None) -> Callable[..., Worker]:
    """Runs a burst worker in this process until no available job remains; returns it."""

    def run(**options: Any) -> Worker:
        options.setdefault("concurrency", 4)
        options.setdefault("maintenance", False)
        worker = Worker(burst=True, **options)
        worker.run()
        return worker

    return run


@pytest.fixture
def worker_environment() -> dict[str, str]:
    """The environment for a worker subprocess: this test's database and short timings."""
    import os

    from django.db import connection

    settings = connection.settings_dict
    url = (
        f"postgres://{settings['USER']}:{settings['PASSWORD'] or ''}@{settings['HOST']}:"
        f"{settings['PORT']}/{settings['NAME']}"
    )
    return {
        **os.environ,
        "DATABASE_URL": url,
        "EDDYQ_POLL_INTERVAL": "100ms",
        "EDDYQ_HEARTBEAT_INTERVAL": "1s",
        "EDDYQ_STALE_AFTER": "5s",
        # The tests' own tasks live outside any app's tasks module.
        "EDDYQ_TASK_MODULES": "tests.jobs",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def start_worker(worker_environment: dict[str, str], tmp_path: Path) -> Iterator[StartWorker]:
    """Starts real worker processes (``start("--burst", ...)``), all killed at the end."""
    yield from start_worker_processes(worker_environment, tmp_path)
