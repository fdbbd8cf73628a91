"""Changing one job from the outside: cancel and retry, each one atomic statement."""

from __future__ import annotations

from django.db import connections, transaction

from django_eddyq import sql
from django_eddyq.conf import eddyq_settings


def cancel_job(job_id: int) -> bool:
    alias = eddyq_settings.DATABASE
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(sql.CANCEL_JOB, {"id": job_id})
        row = cursor.fetchone()
        if row is None:
            return False
        _job_id, state, batch_id = row[:3]
        if state == "cancelled" and batch_id is not None:
            from django_eddyq.batches import complete_batches

            complete_batches(cursor, [batch_id])
    return True


def retry_job(job_id: int) -> bool:
    with connections[eddyq_settings.DATABASE].cursor() as cursor:
        cursor.execute(sql.RETRY_JOB, {"id": job_id})
        if cursor.fetchone() is not None:
            return True
        cursor.execute(sql.JOB_STATE, {"id": job_id})
        row = cursor.fetchone()
    if row is not None and row[0] == "completed":
        raise ValueError(f"job {job_id} completed: a completed job cannot be retried")
    return False
