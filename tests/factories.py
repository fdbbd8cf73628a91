"""factory-boy factories for the queue's tables."""

from __future__ import annotations

import factory
from django.utils import timezone

from django_eddyq.models import Batch, Job, Queue


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    task = "tests.jobs.add"
    args = factory.LazyFunction(lambda: [1, 2])
    kwargs = factory.LazyFunction(dict)
    queue = "default"
    priority = 0
    state = Job.State.AVAILABLE
    max_attempts = 25
    run_at = factory.LazyFunction(timezone.now)
    created_at = factory.LazyFunction(timezone.now)

    class Params:
        finished = factory.Trait(
            state=Job.State.COMPLETED,
            attempt=1,
            attempted_at=factory.LazyFunction(timezone.now),
            finalized_at=factory.LazyFunction(timezone.now),
            result=3,
        )
        failed = factory.Trait(
            state=Job.State.FAILED,
            attempt=1,
            attempted_at=factory.LazyFunction(timezone.now),
            finalized_at=factory.LazyFunction(timezone.now),
            errors=factory.LazyFunction(
                lambda: [
                    {
                        "attempt": 1,
                        "at": timezone.now().isoformat(),
                        "error": "ValueError: boom",
                        "exception_class": "builtins.ValueError",
                        "traceback": "Traceback (most recent call last):\nValueError: boom\n",
                    }
                ]
            ),
        )


class BatchFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Batch

    created_at = factory.LazyFunction(timezone.now)


class QueueFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Queue
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"queue-{n}")
    created_at = factory.LazyFunction(timezone.now)
    updated_at = factory.LazyFunction(timezone.now)
