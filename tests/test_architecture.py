"""The package's shape: what it promises to users stays where it is, and its modules import
one another without a cycle (see docs/architecture.md).

The import graph is read from the syntax trees of ``django_eddyq/``: every import of a module of
the package, at the top of a module or inside a function, except those made for type checkers
only (under ``if TYPE_CHECKING:``). A deferred import that hid a cycle would still be a cycle.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "django_eddyq"

# Every name the documentation, the README and the settings promise, by module.
DOCUMENTED = {
    "django_eddyq": [
        "Call",
        "Discard",
        "Snooze",
        "Task",
        "Workflow",
        "batch",
        "cancel_requested",
        "chain",
        "current_job",
        "current_workflow",
        "group",
        "pause_queue",
        "periodic_schedules",
        "resume_queue",
        "run_periodic_now",
        "set_periodic_enabled",
        "set_queue_limits",
        "task",
    ],
    "django_eddyq.signals": [
        "job_enqueued",
        "job_started",
        "job_finished",
        "worker_started",
        "worker_stopping",
        "leader_elected",
        "leader_resigned",
    ],
    "django_eddyq.backend": ["EddyqBackend", "EddyqTask"],
    "django_eddyq.conf": ["eddyq_settings", "InvalidSettingError"],
    "django_eddyq.tracing": ["use_tracer_provider"],
    "django_eddyq.current": ["JobContext", "current_job", "cancel_requested"],
    "django_eddyq.testing": [
        "run_jobs",
        "eager",
        "enqueued",
        "assert_enqueued",
        "assert_not_enqueued",
        "EddyqTestMixin",
    ],
    "django_eddyq.embedded": ["ensure_persistent", "start_throwaway", "stop"],
    "django_eddyq.exceptions": [
        "Discard",
        "InvalidWorkflow",
        "JobRescued",
        "MalformedJob",
        "OutcomeNotStored",
        "ScheduleNotFound",
        "Snooze",
        "TaskNotFound",
    ],
    "django_eddyq.maintenance": [
        "Cleaner",
        "PeriodicEnqueuer",
        "QueueCleaner",
        "Reindexer",
        "Rescuer",
        "Scheduler",
        "Service",
    ],
    "django_eddyq.models": [
        "Batch",
        "Job",
        "Leader",
        "PeriodicSchedule",
        "Queue",
        "WorkerProcess",
        "WorkflowRun",
        "WorkflowStep",
        "WorkflowEdge",
    ],
    "django_eddyq.workflows": [
        "Workflow",
        "Step",
        "chain",
        "group",
        "current_workflow",
        "WorkflowContext",
        "cancel_workflow",
        "retry_workflow",
    ],
    "django_eddyq.worker": ["Worker"],
    "django_eddyq.metrics": ["metrics_view", "registry", "enable", "read_gauges"],
    "django_eddyq.management.commands.eddyq_worker": ["Command"],
    "django_eddyq.management.commands.eddyq_maintenance": ["Command"],
    "django_eddyq.management.commands.eddyq_health": ["Command"],
    "django_eddyq.inspection": ["queue_latencies", "with_worker_status"],
}
MIGRATIONS = [
    "0001_initial",
    "0002_maintenance",
    "0003_cancellation_unique_jobs",
    "0004_jobs_autovacuum",
    "0005_jobs_index_diet",
    "0006_job_times_default_to_transaction",
    "0007_job_payload_permission",
    "0008_worker_registry",
    "0009_periodic_controls",
    "0010_activity",
    "0011_queue_limits",
    "0012_limit_keys",
    "0013_workflows",
]


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_every_documented_name_imports(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in DOCUMENTED[module] if not hasattr(imported, name)]
    assert missing == [], f"{module} lacks {missing}"


def test_the_package_exports_what_it_documents() -> None:
    import django_eddyq

    assert sorted(django_eddyq.__all__) == sorted(DOCUMENTED["django_eddyq"])


def test_migrations_keep_their_names() -> None:
    on_disk = sorted(path.stem for path in (PACKAGE / "migrations").glob("0*.py"))
    assert on_disk == MIGRATIONS


# The import graph.


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports of ``tree``, anywhere in it, but those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if _type_checking_only(node):
            assert isinstance(node, ast.If)
            for other in node.orelse:
                yield from _runtime_imports(other)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _runtime_imports(node)


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports. ``from package import name`` counts
    as an import of ``package.name`` when that is a module, else of ``package`` itself."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _runtime_imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = _package_of(name, path).split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    for alias in node.names
                ]
            graph[name] |= {target for target in targets if target in known and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_graph_sees_deferred_imports_and_skips_type_checking_ones() -> None:
    graph = import_graph()
    # enqueue.py imports the tasks module for type checkers only.
    assert "django_eddyq.tasks" not in graph["django_eddyq.enqueue"]
    # apps.py imports its checks inside ready().
    assert "django_eddyq.checks" in graph["django_eddyq.apps"]
