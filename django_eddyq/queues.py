"""Pausing and resuming queues: workers stop claiming from a paused queue, running jobs finish."""

from __future__ import annotations

from django.db import connections

from django_eddyq import sql
from django_eddyq.base import validate_queue_name
from django_eddyq.conf import eddyq_settings
from django_eddyq.models import Queue


def pause_queue(name: str) -> Queue:
    """Stop workers claiming from ``name`` (its row is created if needed); returns the queue.

    The claim itself skips paused queues, so every worker stops at its next claim; jobs already
    running finish.
    """
    return _set_paused(name, paused=True)


def resume_queue(name: str) -> Queue:
    """Let workers claim from ``name`` again, waking idle ones at once; returns the queue."""
    return _set_paused(name, paused=False)


def _set_paused(name: str, *, paused: bool) -> Queue:
    validate_queue_name(name)
    with connections[eddyq_settings.DATABASE].cursor() as cursor:
        cursor.execute(sql.SET_QUEUE_PAUSED, {"name": name, "paused": paused})
        if not paused:
            cursor.execute(sql.NOTIFY_QUEUE, {"name": name})
    return Queue.objects.get(name=name)
