"""The tasks this process may run: declared tasks, found by name, never imported on a row's word.

A job's ``task`` column is only a name. A worker runs a job only if a task was declared under that
name in its own process: by ``@task``, or by ``django.tasks.task`` with eddyq's backend. Tasks are
declared when their modules are imported, and ``discover()`` imports exactly two kinds of module,
once: the ``tasks`` module of every installed app, and the modules listed in
``EDDYQ["TASK_MODULES"]``. Whatever a row names, nothing else is imported and no other callable
runs: a writer to the jobs table cannot make a worker call ``os.system``.
"""

from __future__ import annotations

import dataclasses
import threading
from importlib import import_module

from django.utils.module_loading import autodiscover_modules

from django_eddyq.conf import eddyq_settings
from django_eddyq.exceptions import TaskNotFound
from django_eddyq.handlers import Handler


@dataclasses.dataclass(frozen=True, slots=True)
class Declared:
    """A declared task: what declared it (an eddyq ``Task`` or a Django ``Task``) and how a
    worker runs its jobs."""

    task: object
    handler: Handler


_declared: dict[str, Declared] = {}
_discovered = False
_discovering = threading.Lock()


def declare(path: str, task: object, handler: Handler) -> None:
    """Register ``task`` under ``path``, its ``module.qualname``.

    The first declaration of a function wins over later ones of the same function (copies made
    by ``using()``, a second decoration); a different function at the same path (a reloaded
    module) replaces it.
    """
    existing = _declared.get(path)
    if existing is not None and existing.handler.func is handler.func:
        return
    _declared[path] = Declared(task, handler)


def lookup(path: str) -> Declared:
    """The task declared as ``path``; ``TaskNotFound`` if there is none, even after discovery."""
    declared = _declared.get(path)
    if declared is None:
        discover()
        declared = _declared.get(path)
    if declared is None:
        raise TaskNotFound(
            f"{path!r} is not a registered task: declare it with @task (or django.tasks' @task "
            "with eddyq's backend) in an installed app's tasks module or in a module of "
            'EDDYQ["TASK_MODULES"]'
        )
    return declared


def handler(path: str) -> Handler:
    """How to run a job of the task declared as ``path``; ``TaskNotFound`` if none is."""
    return lookup(path).handler


def limited_tasks() -> dict[str, Declared]:
    """The declared tasks limited per key, by path: the keyed claim's."""
    return {
        path: declared
        for path, declared in _declared.items()
        if declared.handler.limits is not None
    }


def discover() -> None:
    """Import the installed apps' ``tasks`` modules and ``TASK_MODULES``, once per process.

    An import that fails raises, and the next call tries again: a worker must not start with
    part of its tasks missing.
    """
    global _discovered
    if _discovered:
        return
    with _discovering:
        if _discovered:
            return
        autodiscover_modules("tasks")
        for module in eddyq_settings.TASK_MODULES:
            import_module(module)
        _discovered = True
