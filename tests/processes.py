"""Helpers for tests that start real worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

MANAGE = Path(__file__).resolve().parent.parent / "testproject" / "manage.py"

StartWorker = Callable[..., subprocess.Popen[bytes]]


def start_worker_processes(
    worker_environment: dict[str, str], tmp_path: Path
) -> Iterator[StartWorker]:
    """Starts ``manage.py eddyq_worker`` processes; kills whatever is left of them at the end.

    Each one's output goes to a log file in ``tmp_path``, named after its order.
    """
    started: list[subprocess.Popen[bytes]] = []

    def start(*arguments: str) -> subprocess.Popen[bytes]:
        with (tmp_path / f"worker-{len(started)}.log").open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, str(MANAGE), "eddyq_worker", *arguments],
                env=worker_environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            if process.poll() is None:
                for pid in children_of(process.pid):
                    os.kill(pid, signal.SIGKILL)
                process.kill()
                process.wait(10)


def children_of(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(entry.name))
    return children


def wait_for(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the condition")
        time.sleep(0.05)
