"""Maintenance services: exactly one process at a time runs them, the elected leader."""

from django_eddyq.maintenance.activity import ActivitySampler
from django_eddyq.maintenance.cleaner import Cleaner
from django_eddyq.maintenance.periodic import PeriodicEnqueuer
from django_eddyq.maintenance.queue_cleaner import QueueCleaner
from django_eddyq.maintenance.reindexer import Reindexer
from django_eddyq.maintenance.rescuer import Rescuer
from django_eddyq.maintenance.scheduler import Scheduler
from django_eddyq.maintenance.service import Service

__all__ = [
    "ActivitySampler",
    "Cleaner",
    "PeriodicEnqueuer",
    "QueueCleaner",
    "Reindexer",
    "Rescuer",
    "Scheduler",
    "Service",
    "all_services",
]


def all_services() -> list[Service]:
    """A new instance of every maintenance service, in the order a pass runs them."""
    return [
        Rescuer(),
        Scheduler(),
        PeriodicEnqueuer(),
        Cleaner(),
        QueueCleaner(),
        Reindexer(),
        ActivitySampler(),
    ]
