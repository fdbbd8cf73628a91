"""Sample tasks the demo enqueues: some succeed, some retry, some fail for good."""

import os
import random
import time

from demo.models import Execution
from django_eddyq import Discard, task


@task
def send_welcome_email(user_id: int) -> dict[str, object]:
    time.sleep(random.uniform(0.01, 0.1))
    Execution.objects.create(label=f"welcome {user_id}", pid=os.getpid())
    return {"sent_to": user_id}


@task(queue="reports", priority=10)
def build_report(name: str, rows: int = 100) -> int:
    time.sleep(random.uniform(0.05, 0.2))
    return rows


@task(max_attempts=3, backoff=lambda attempt: 1)
def flaky_sync(account: str) -> str:
    if random.random() < 0.5:
        raise ConnectionError(f"upstream refused account {account}")
    return f"synced {account}"


@task(max_attempts=2, backoff=lambda attempt: 1)
def always_fails(reason: str) -> None:
    raise RuntimeError(reason)


@task
def reject_bad_input(payload: dict[str, object]) -> None:
    raise Discard(f"payload is missing 'email': {payload!r}")
