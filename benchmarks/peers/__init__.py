"""Adapters of the peers benchmarks/run.py measures django-eddyq against.

Each module drives one library through its own public API, on a database of its own, and is run
as ``python -m benchmarks.peers.<module> <command> '<json config>'`` (see benchmarks/common.py).
``PEERS`` lists them in table order: module, the distribution ``pip`` installs, its name.
"""

PEERS: list[tuple[str, str, str]] = [
    ("procrastinate", "procrastinate", "Procrastinate"),
    ("pgqueuer", "pgqueuer", "PgQueuer"),
    ("chancy", "chancy", "Chancy"),
    ("django_tasks_db", "django-tasks-db", "django-tasks-db"),
]
