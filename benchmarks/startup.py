"""What a worker does from spawn to its first job done, step by step.

    python benchmarks/startup.py [--runs 7] [--processes 1] [--importtime]

Runs against ``DATABASE_URL`` (or the demo's embedded PostgreSQL), in ``drain.py``'s database
(``eddyq_bench``). Each run enqueues one no-op job and spawns a worker for it, three ways,
alternated so that a busy spell of a shared machine weighs on each alike:

* ``eddyq_worker --burst``, untouched: seconds from spawn to the job's claim (its
  ``attempted_at``), to the job done (its ``finalized_at``; the database's clock, this
  machine's) and to the process's exit;
* the same command with each start-up step timed (``python -m benchmarks.startup trace``
  wraps them before running the command): the timeline of one run, and the median of each step;
* the raw floor: a Python process that imports psycopg, connects, claims the job with one
  ``UPDATE ... FOR UPDATE SKIP LOCKED`` and marks it completed (two commits), as the raw loop
  of ``raw.py`` does: what any worker pays; and the same after what any worker in a Django
  project pays, ``django.setup()`` of the test project without django-eddyq and the system
  checks.

``--against DIR`` adds a fourth, alternated with the others: the untouched command of another
checkout of the repository (e.g. ``git worktree add /tmp/base HEAD~1``), for a before/after
comparison on a shared, noisy machine. ``--importtime`` also runs the command once under
``python -X importtime`` and prints what its imports cost, by package.
"""

from __future__ import annotations

import argparse
import atexit
import compileall
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # python benchmarks/startup.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.drain import MANAGE, REPO, setup_django

WORKER_ENVIRONMENT = {
    "DJANGO_LOG_LEVEL": "WARNING",
    "DJANGO_DEBUG": "False",
    "EDDYQ_TASK_MODULES": "benchmarks.noop",
}

CLAIM_AND_COMPLETE = """
with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as connection:
    with connection.transaction():
        claimed = connection.execute(
            "UPDATE eddyq_jobs SET state = 'running', attempt = attempt + 1,"
            " attempted_at = clock_timestamp() WHERE id = (SELECT id FROM eddyq_jobs"
            " WHERE state = 'available' ORDER BY priority DESC, run_at, id"
            " FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING id"
        ).fetchall()
    with connection.transaction():
        connection.execute(
            "UPDATE eddyq_jobs SET state = 'completed', finalized_at = clock_timestamp()"
            " WHERE id = ANY(%s)",
            [[row[0] for row in claimed]],
        )
"""
RAW_WORKER = "import os\nimport psycopg\n" + CLAIM_AND_COMPLETE
# The same, after what any worker inside a Django project pays: Django's setup of the test
# project without django-eddyq (and the demo app, which needs it) and the system checks.
DJANGO_WORKER = (
    """
import os, sys
sys.path[:0] = [os.environ["STARTUP_PROJECT"], os.path.dirname(os.environ["STARTUP_PROJECT"])]
os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
import django
from django.conf import settings
settings.INSTALLED_APPS = [
    app for app in settings.INSTALLED_APPS if app not in ("django_eddyq", "demo")
]
django.setup()
import types
from django.contrib import admin
from django.urls import path
urls = types.ModuleType("startup_urls")  # the test project's, without the demo's view
urls.urlpatterns = [path("admin/", admin.site.urls)]
sys.modules["startup_urls"] = urls
settings.ROOT_URLCONF = "startup_urls"
from django.core.management.base import BaseCommand
BaseCommand().check(databases=["default"], display_num_errors=False)
import psycopg
"""
    + CLAIM_AND_COMPLETE
)


# --------------------------------------------------------------------------------------------------
# The traced worker: ``python -m benchmarks.startup trace <output file> <worker arguments>``


class Timeline:
    """Each timed step's first call (or every call, for connections): its thread, its start and
    end, in seconds since the spawn (``STARTUP_SPAWNED_AT``, the parent's ``time.time()``)."""

    def __init__(self, spawned_at: float) -> None:
        self.spawned_at = spawned_at
        self.steps: list[dict[str, Any]] = []
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def record(self, label: str, started: float, ended: float) -> None:
        with self._lock:
            self.steps.append(
                {
                    "step": label,
                    "thread": threading.current_thread().name,
                    "start": started - self.spawned_at,
                    "end": ended - self.spawned_at,
                }
            )

    def first_only(self, label: str) -> bool:
        with self._lock:
            if label in self._seen:
                return False
            self._seen.add(label)
            return True

    def wrap(
        self,
        owner: Any,
        attribute: str,
        label: str | Callable[[tuple[Any, ...]], str],
        every_call: bool = False,
    ) -> None:
        """Time ``owner.attribute``'s first call under ``label`` (or every call, numbered)."""
        original = getattr(owner, attribute)
        calls = iter(range(1, 1000))

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            name = label(args) if callable(label) else label
            if every_call:
                name = f"{name} #{next(calls)}"
            elif not self.first_only(name):
                return original(*args, **kwargs)
            started = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                self.record(name, started, time.time())

        setattr(owner, attribute, timed)


def trace(output: str, worker_arguments: list[str]) -> None:
    main_at = time.time()
    timeline = Timeline(float(os.environ["STARTUP_SPAWNED_AT"]))
    timeline.record("interpreter start (spawn → first line)", timeline.spawned_at, main_at)
    atexit.register(lambda: Path(output).write_text(json.dumps(timeline.steps)))
    sys.path[:0] = [str(REPO / "testproject"), str(REPO)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

    started = time.time()
    import django

    timeline.record("import django", started, time.time())
    started = time.time()
    django.setup()
    timeline.record("django.setup() (settings, apps, models)", started, time.time())
    started = time.time()
    from django.core.management import load_command_class

    command = load_command_class("django_eddyq", "eddyq_worker")
    timeline.record("import the eddyq_worker command", started, time.time())

    from django.db.backends.base.base import BaseDatabaseWrapper

    from django_eddyq import db, registry
    from django_eddyq.election import Elector
    from django_eddyq.listener import Listener
    from django_eddyq.maintenance.service import Service
    from django_eddyq.worker import worker as worker_module
    from django_eddyq.worker.passes import PassRunner
    from django_eddyq.worker.planning import Planner
    from django_eddyq.worker.slots import Slots

    timeline.wrap(type(command), "check", "system checks")
    timeline.wrap(registry, "discover", "registry.discover()")
    timeline.wrap(worker_module.Worker, "on_start", "Worker.on_start() in all")
    timeline.wrap(PassRunner, "connect", "worker connection (PassRunner.connect)")
    timeline.wrap(worker_module, "apply_configured_limits", 'EDDYQ["QUEUES"] applied')
    timeline.wrap(worker_module.Worker, "_recover_stale", "start-up recovery (_recover_stale)")
    timeline.wrap(Listener, "start", "listener thread started")
    timeline.wrap(Elector, "start", "elector thread started")
    timeline.wrap(Elector, "_campaign", "election: first campaign")
    timeline.wrap(PassRunner, "start_thread", "database thread started")
    timeline.wrap(Slots, "start_threads", "handler threads started")
    timeline.wrap(Planner, "run_once", "first pass (claim)")
    timeline.wrap(db, "connect", "psycopg connection", every_call=True)
    timeline.wrap(BaseDatabaseWrapper, "connect", "Django connection", every_call=True)
    timeline.wrap(Service, "loop_pass", lambda args: f"maintenance: first {args[0].name} pass")
    command.run_from_argv(["manage.py", "eddyq_worker", *worker_arguments])


# --------------------------------------------------------------------------------------------------
# The parent


def enqueue_one() -> None:
    from django.db import connection

    from benchmarks.noop import noop

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE eddyq_jobs")
    noop.enqueue()


def job_times() -> tuple[float, float]:
    """The job's claim and completion, as ``time.time()`` values (the database's clock)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, extract(epoch FROM attempted_at), extract(epoch FROM finalized_at)"
            " FROM eddyq_jobs"
        )
        rows = cursor.fetchall()
    if len(rows) != 1 or rows[0][0] != "completed":
        raise SystemExit(f"the job was not completed: {rows}")
    return float(rows[0][1]), float(rows[0][2])


def spawn(argv: list[str], environment: dict[str, str]) -> dict[str, float]:
    """Run ``argv``; seconds from spawn to the job's claim, to the job done, to exit."""
    enqueue_one()
    spawned_at = time.time()
    subprocess.run(
        argv,
        check=True,
        env={
            **os.environ,
            **WORKER_ENVIRONMENT,
            **environment,
            "STARTUP_SPAWNED_AT": repr(spawned_at),
        },
        stdout=subprocess.DEVNULL,
    )
    exited_at = time.time()
    claimed_at, done_at = job_times()
    return {
        "claim": claimed_at - spawned_at,
        "done": done_at - spawned_at,
        "exit": exited_at - spawned_at,
    }


def compile_bytecode(checkouts: list[Path]) -> None:
    """As installing a package does (see run.py's ``compile_bytecode``): with
    PYTHONDONTWRITEBYTECODE set, each start would compile the modules anew."""
    for checkout in checkouts:
        for folder in ("django_eddyq", "testproject", "benchmarks"):
            compileall.compile_dir(checkout / folder, quiet=1)


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def print_importtime(worker_arguments: list[str]) -> None:
    """Cumulative import time of each top-level import of the command, and self time summed
    by package (its first two dotted names)."""
    enqueue_one()
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", str(MANAGE), "eddyq_worker", *worker_arguments],
        env={**os.environ, **WORKER_ENVIRONMENT},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=True,
    )
    own: dict[str, int] = defaultdict(int)
    total = 0
    top: list[tuple[int, str]] = []
    for line in completed.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = line[len("import time:") :].split("|")
        module = name.strip()
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        total += int(self_us)
        own[".".join(module.split(".")[:2])] += int(self_us)
        if depth == 0:
            top.append((int(cumulative_us), module))
    print(f"\nImports (python -X importtime, one run): {total / 1e6:.3f} s in all")
    print("  top-level imports, cumulative:")
    for cumulative, module in sorted(top, reverse=True)[:15]:
        print(f"    {cumulative / 1e6:6.3f} s  {module}")
    print("  self time by package:")
    for package, us in sorted(own.items(), key=lambda item: -item[1])[:25]:
        print(f"    {us / 1e6:6.3f} s  {package}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "trace":
        trace(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument(
        "--no-trace", action="store_true", help="only the untouched runs (and the floors)"
    )
    parser.add_argument(
        "--against", type=Path, metavar="DIR", help="another checkout's worker, alternated"
    )
    options = parser.parse_args()
    setup_django()
    compile_bytecode([REPO, *([options.against] if options.against else [])])
    worker_arguments = ["--burst", "--concurrency", str(options.concurrency), "-v", "0"]
    if options.processes > 1:
        worker_arguments += ["--processes", str(options.processes)]
    command = [sys.executable, str(MANAGE), "eddyq_worker", *worker_arguments]
    raw = [sys.executable, "-c", RAW_WORKER]
    django_floor = [sys.executable, "-c", DJANGO_WORKER]

    print(f"load average before: {load_average()}")
    plain: list[dict[str, float]] = []
    floor: list[dict[str, float]] = []
    django_only: list[dict[str, float]] = []
    other: list[dict[str, float]] = []
    other_command = other_environment = None
    if options.against:
        other_root = options.against.resolve()
        other_command = [
            sys.executable,
            str(other_root / "testproject" / "manage.py"),
            "eddyq_worker",
            *worker_arguments,
        ]
        other_environment = {"PYTHONPATH": str(other_root)}
    traced: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for run in range(options.runs):
            plain.append(spawn(command, {"PYTHONPATH": str(REPO)}))
            if other_command is not None and other_environment is not None:
                other.append(spawn(other_command, other_environment))
            floor.append(spawn(raw, {}))
            django_only.append(spawn(django_floor, {"STARTUP_PROJECT": str(MANAGE.parent)}))
            if options.no_trace:
                continue
            output = Path(folder) / f"trace-{run}.json"
            outcome = spawn(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.startup",
                    "trace",
                    str(output),
                    *worker_arguments,
                ],
                {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
            )
            traced.append({"outcome": outcome, "steps": json.loads(output.read_text())})
    print(f"load average after:  {load_average()}")

    print(f"\nSpawn → ... (s), median of {options.runs}: {' '.join(worker_arguments)}")
    print(f"  {'':52} {'claim':>7} {'done':>7} {'exit':>7}")
    compared = [(f"eddyq_worker --burst of {options.against}", other)] if other else []
    for label, runs in [
        ("eddyq_worker --burst", plain),
        *compared,
        ("the same, traced", [t["outcome"] for t in traced]),
        ("raw psycopg: import, connect, claim, complete", floor),
        ("the same after Django's setup and checks, no eddyq", django_only),
    ]:
        if not runs:
            continue
        print(
            f"  {label:52} "
            + " ".join(
                f"{statistics.median(r[key] for r in runs):7.3f}"
                for key in ("claim", "done", "exit")
            )
        )
    print("  eddyq_worker runs (done): " + " ".join(f"{r['done']:.3f}" for r in plain))
    if other:
        print("  the other's runs (done):  " + " ".join(f"{r['done']:.3f}" for r in other))
        # Each run of one is next to a run of the other: their differences cancel what a
        # busy spell of the machine adds to both.
        pairs = list(zip(plain, other, strict=True))
        differences = {
            key: statistics.median(a[key] - b[key] for a, b in pairs)
            for key in ("claim", "done", "exit")
        }
        print(
            "  median of the differences run by run (this - the other): "
            + ", ".join(f"{key} {value * 1000:+.0f} ms" for key, value in differences.items())
        )
        print(
            "  claim → done, this / the other: "
            f"{statistics.median(r['done'] - r['claim'] for r in plain) * 1000:.0f} / "
            f"{statistics.median(r['done'] - r['claim'] for r in other) * 1000:.0f} ms"
        )
    if traced:
        print_trace(traced, options.runs)
    if options.importtime:
        print_importtime(worker_arguments)


def print_trace(traced: list[dict[str, Any]], runs: int) -> None:
    """The median start, end and duration of each step, then every call of the median run."""
    by_step: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for run in traced:
        for step in run["steps"]:
            by_step[step["step"]].append((step["start"], step["end"], step["thread"]))
    print(f"\nTraced steps, median over {runs} runs (s since spawn; first call of each):")
    print(f"  {'start':>6} {'end':>6} {'took':>6}  {'thread':16} step")
    rows = []
    for label, calls in by_step.items():
        start = statistics.median(c[0] for c in calls)
        end = statistics.median(c[1] for c in calls)
        took = statistics.median(c[1] - c[0] for c in calls)
        rows.append((start, end, took, calls[0][2], label, len(calls)))
    for start, end, took, thread, label, count in sorted(rows):
        some = f" (in {count} of {runs} runs)" if count != runs else ""
        print(f"  {start:6.3f} {end:6.3f} {took:6.3f}  {thread[:16]:16} {label}{some}")
    done = statistics.median(t["outcome"]["done"] for t in traced)
    print(f"  {done:6.3f} {'':6} {'':6}  {'':16} the job done (finalized_at)")

    median_run = sorted(traced, key=lambda t: t["outcome"]["done"])[len(traced) // 2]
    print(f"\nOne traced run (its job done at {median_run['outcome']['done']:.3f} s), every call:")
    for step in sorted(median_run["steps"], key=lambda s: s["start"]):
        print(
            f"  {step['start']:6.3f} {step['end']:6.3f} {step['end'] - step['start']:6.3f}  "
            f"{step['thread'][:16]:16} {step['step']}"
        )


if __name__ == "__main__":
    main()
