"""``manage.py eddyq_maintenance``: one pass of the named services, or a dry run."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_eddyq.models import Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def run(*arguments: str) -> str:
    out = StringIO()
    call_command("eddyq_maintenance", *arguments, stdout=out)
    return out.getvalue()


def stuck_and_due_jobs() -> tuple[Job, Job, Job]:
    long_ago = timezone.now() - timedelta(days=30)
    stuck = JobFactory(
        state=Job.State.RUNNING, attempt=1, locked_by="gone:1:x", locked_until=long_ago
    )
    due = JobFactory(state=Job.State.SCHEDULED, run_at=long_ago)
    expired = JobFactory(finished=True, finalized_at=long_ago)
    return stuck, due, expired


def test_runs_the_named_services_and_reports_counts() -> None:
    stuck, due, expired = stuck_and_due_jobs()
    output = run("rescuer", "scheduler")
    assert "rescuer: 1 rescued" in output
    assert "scheduler: 1 made available" in output
    assert "cleaner" not in output
    assert Job.all_objects.get(pk=stuck.pk).state == Job.State.RETRYABLE
    assert Job.all_objects.get(pk=due.pk).state == Job.State.AVAILABLE
    assert Job.all_objects.filter(pk=expired.pk).exists()


@pytest.mark.django_db(transaction=True)  # the reindexer can't run inside a transaction
def test_runs_every_service_by_default() -> None:
    _stuck, _due, expired = stuck_and_due_jobs()
    output = run()
    for name in ("rescuer", "scheduler", "periodic", "cleaner", "queue_cleaner", "reindexer"):
        assert f"{name}:" in output
    assert "cleaner: 1 deleted" in output
    assert "reindexer: 4 rebuilt" in output
    assert not Job.all_objects.filter(pk=expired.pk).exists()


def test_dry_run_changes_nothing_and_says_what_it_would_do() -> None:
    stuck, due, expired = stuck_and_due_jobs()
    output = run("--dry-run")
    assert "rescuer: would have rescued 1 (dry run)" in output
    assert "scheduler: would have made available 1 (dry run)" in output
    assert "cleaner: would have deleted 1 (dry run)" in output
    assert "reindexer: would run REINDEX INDEX CONCURRENTLY" in output
    assert Job.all_objects.get(pk=stuck.pk).state == Job.State.RUNNING
    assert Job.all_objects.get(pk=due.pk).state == Job.State.SCHEDULED
    assert Job.all_objects.filter(pk=expired.pk).exists()


def test_unknown_services_are_refused_by_name() -> None:
    with pytest.raises(CommandError, match="Unknown service sweeper; choose from rescuer"):
        run("sweeper")
