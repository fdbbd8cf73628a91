"""pytest fixtures for projects that use django-eddyq (see ``django_eddyq.testing``).

Loaded by pytest on its own once django-eddyq is installed (the ``pytest11`` entry point):

* ``run_jobs``: ``run_jobs()`` runs the due jobs in the test's process and transaction;
* ``eddyq_eager``: while the test runs, jobs run as the transaction that enqueued them commits.

Both need the database (``@pytest.mark.django_db``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def run_jobs(db: None) -> Callable[..., list[Any]]:
    # Imported here: pytest loads this plugin before Django is set up.
    from django_eddyq.testing import run_jobs

    return run_jobs


@pytest.fixture
def eddyq_eager(db: None) -> Iterator[None]:
    from django_eddyq.testing import eager

    with eager():
        yield
