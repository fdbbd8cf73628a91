"""Flow control's vocabulary: a global concurrency and a rate, of a queue (as settings, the API
and the admin write them) or of each key of a task (as ``@task`` declares them), checked once
for all of them; and the keys a task's jobs are limited by.

A leaf beside ``vocabulary``: importable before Django's apps are ready, as settings are read
early. The limits are enforced by the claim (``sql.limited_claim_statement``), in the database.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

from django_eddyq.vocabulary import validate_positive_int

#: A rate as written: "100/m", "5/s", "1000/h", "2/10s" (at most 2 in any 10 seconds).
RATE = re.compile(r"\s*([0-9]+)\s*/\s*([0-9]*\.?[0-9]*)\s*(s|sec|m|min|h|hour|d|day)\s*")
RATE_RULE = 'N/PERIOD, e.g. "100/m", "5/s", "1000/h", "2/10s"'
UNIT_SECONDS = {
    "s": 1,
    "sec": 1,
    "m": 60,
    "min": 60,
    "h": 3600,
    "hour": 3600,
    "d": 86400,
    "day": 86400,
}
#: The keys of an ``EDDYQ["QUEUES"]`` entry.
QUEUE_LIMIT_KEYS = frozenset({"concurrency", "rate", "burst"})
#: The largest number a limit takes (PostgreSQL's integer).
MAX_LIMIT = 2**31 - 1
#: The longest period of a rate, in seconds: about a hundred years.
MAX_PERIOD_SECONDS = 100 * 365 * 86400


@dataclasses.dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` jobs started per ``period_seconds``, and never more than ``burst`` at
    once after a quiet spell: a token bucket of ``burst`` tokens refilled at
    ``limit / period_seconds`` a second."""

    limit: int
    period_seconds: float
    burst: int

    def __str__(self) -> str:
        return f"{self.limit}/{_period_text(self.period_seconds)}"


def default_burst(limit: int, period_seconds: float) -> int:
    """One second's worth of the rate, at least one job and at most ``limit``: a queue limited
    to "100/m" starts at most 2 at once, one limited to "10/s" 10, so that over any minute the
    count stays within a few percent of the rate."""
    return max(1, min(limit, math.ceil(limit / period_seconds)))


def parse_rate(text: object, burst: object = None) -> Rate:
    """``Rate`` of ``text`` ("100/m"); ``burst`` None takes ``default_burst``. ValueError names
    what is wrong."""
    if isinstance(text, Rate):
        return text if burst is None else parse_rate(str(text), burst)
    match = RATE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"rate {text!r} is invalid: write {RATE_RULE}")
    limit = int(match.group(1))
    multiple = float(match.group(2)) if match.group(2) not in ("", ".") else 1.0
    period_seconds = multiple * UNIT_SECONDS[match.group(3)]
    if not 1 <= limit <= MAX_LIMIT or not 0 < period_seconds <= MAX_PERIOD_SECONDS:
        raise ValueError(
            f"rate {text!r} is invalid: give 1 or more jobs per a period over 0 and within "
            "a hundred years"
        )
    if burst is None:
        return Rate(limit, period_seconds, default_burst(limit, period_seconds))
    burst = validate_positive_int(burst, "burst")
    if burst > limit:
        raise ValueError(f"burst {burst} is more than the rate's {limit} jobs per period")
    return Rate(limit, period_seconds, burst)


def validate_concurrency(value: object) -> int | None:
    """A global concurrency: None (no limit) or an integer of 1 or more."""
    if value is None:
        return None
    concurrency = validate_positive_int(value, "concurrency")
    if concurrency > MAX_LIMIT:
        raise ValueError(f"concurrency {concurrency} is more than {MAX_LIMIT}")
    return concurrency


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """A queue's limits, or a task's per key, across every worker: ``concurrency`` jobs running
    at most, ``rate`` started per period at most; None for no limit."""

    concurrency: int | None = None
    rate: Rate | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> Limits:
        """From an ``EDDYQ["QUEUES"]`` entry's options; ValueError names what is wrong."""
        unknown = set(options) - QUEUE_LIMIT_KEYS
        if unknown:
            raise ValueError(f"unknown keys {', '.join(sorted(unknown))}")
        rate = options.get("rate")
        if rate is None and options.get("burst") is not None:
            raise ValueError("burst is given without a rate")
        return cls(
            concurrency=validate_concurrency(options.get("concurrency")),
            rate=None if rate is None else parse_rate(rate, options.get("burst")),
        )

    def __bool__(self) -> bool:
        return self.concurrency is not None or self.rate is not None


#: The longest limit key, in characters: keys are indexed, and name a rate's bucket.
MAX_KEY_LENGTH = 200
#: The key of a task limited as a whole (declared without ``key=``): one key for all its jobs.
WHOLE_TASK_KEY = ""


def limit_key(value: object, *, task: str) -> str:
    """The stored form of what a task's ``key`` function returned: a string or an integer, as
    text. TypeError or ValueError names the task and what is wrong."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(
            f"the key of task {task} must be a string or an integer, not {type(value).__name__}"
        )
    text = str(value)
    if len(text) > MAX_KEY_LENGTH:
        raise ValueError(
            f"the key of task {task} is {len(text)} characters long, more than {MAX_KEY_LENGTH}"
        )
    if "\x00" in text:
        raise ValueError(f"the key of task {task} holds a NUL character, which text cannot")
    return text


def _period_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds % size == 0:
            count = int(seconds // size)
            return unit if count == 1 else f"{count}{unit}"
    return f"{seconds:g}s"
