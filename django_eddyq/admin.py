"""The admin: read-only inspection of jobs, batches and queues."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from django_eddyq.models import Batch, Job, Queue


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "task",
        "queue",
        "state",
        "attempt",
        "max_attempts",
        "run_at",
        "finalized_at",
    )
    list_filter = ("state", "queue")
    search_fields = ("=id", "task")
    show_full_result_count = False


@admin.register(Batch)
class BatchAdmin(ReadOnlyAdmin):
    list_display = ("id", "state", "callback_task", "created_at", "finalized_at")
    list_filter = ("state",)


@admin.register(Queue)
class QueueAdmin(ReadOnlyAdmin):
    list_display = ("name", "paused_at", "updated_at")
