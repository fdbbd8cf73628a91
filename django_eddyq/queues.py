"""Steering queues: pausing and resuming them (workers stop claiming from a paused queue,
running jobs finish), and limiting them across every worker (``docs/flow-control.md``)."""

from __future__ import annotations

from django_eddyq import operations
from django_eddyq.limits import Rate
from django_eddyq.models import Queue
from django_eddyq.operations import set_queue_paused


def pause_queue(name: str) -> Queue:
    """Stop workers claiming from ``name`` (its row is created if needed); returns the queue.

    The claim itself skips paused queues, so every worker stops at its next claim; jobs already
    running finish.
    """
    set_queue_paused(name, paused=True)
    return Queue.objects.get(name=name)


def resume_queue(name: str) -> Queue:
    """Let workers claim from ``name`` again, waking idle ones at once; returns the queue."""
    set_queue_paused(name, paused=False)
    return Queue.objects.get(name=name)


def set_queue_limits(
    name: str,
    *,
    concurrency: int | None = None,
    rate: str | Rate | None = None,
    burst: int | None = None,
) -> Queue:
    """Limit the queue ``name`` across every worker, on every machine: at most
    ``concurrency`` of its jobs running at once, at most ``rate`` of them started per period
    ("100/m", "5/s"), at most ``burst`` at once after a quiet spell (by default one second's
    worth of the rate). None lifts a limit. Every worker follows within a poll interval,
    without a restart; returns the queue. ValueError names what is wrong."""
    operations.set_queue_limits(name, concurrency=concurrency, rate=rate, burst=burst)
    return Queue.objects.get(name=name)
