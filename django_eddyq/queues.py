"""Pausing and resuming queues: workers stop claiming from a paused queue, running jobs finish."""

from __future__ import annotations

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
