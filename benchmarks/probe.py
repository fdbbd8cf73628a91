"""The latency probe task of django-eddyq: records when its handler starts (see harness.py)."""

from benchmarks.common import record_start
from django_eddyq import task


@task
def probe(key: int) -> None:
    record_start(key)
