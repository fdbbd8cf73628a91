"""Managers: ``Job.objects`` hides jobs past their retention deadline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models

if TYPE_CHECKING:
    from django_eddyq.models import Job


class JobManager(models.Manager["Job"]):
    """Placeholder: the retention filter arrives with the cleaner."""
