"""``eddyq pause QUEUE…`` and ``eddyq resume QUEUE…``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_eddyq.management.cli.output import OK, to_json
from django_eddyq.operations import set_queue_paused


def set_paused(stdout: Any, names: Sequence[str], *, paused: bool, as_json: bool) -> int:
    """Pause or resume each queue (a queue not seen yet is created, so that it starts paused);
    resuming wakes the idle workers at once."""
    for name in names:
        set_queue_paused(name, paused=paused)
    verb = "paused" if paused else "resumed"
    if as_json:
        stdout.write(to_json({"queues": list(names), "paused": paused}))
    else:
        for name in names:
            stdout.write(f"Queue {name} {verb}.")
    return OK
