"""The worker process: claiming, running and finishing jobs."""

from django_eddyq.worker.worker import Worker, make_worker_id

__all__ = ["Worker", "make_worker_id"]
