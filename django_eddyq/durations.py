"""Durations as people write them in settings: ``90``, ``"1.5"``, ``"500ms"``, ``"1h30m"``."""

import datetime
import math
import re
from decimal import ROUND_HALF_EVEN, Decimal

UNITS_HINT = "use seconds or units like 500ms, 15s, 5m, 24h, 7d, 3w"

# Text is added up in exact microseconds, so that what format_duration writes reads back as the
# same duration, to the microsecond, however long.
_MICROSECONDS_PER_UNIT = {
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60 * 1_000_000,
    "h": 60 * 60 * 1_000_000,
    "d": 24 * 60 * 60 * 1_000_000,
    "w": 7 * 24 * 60 * 60 * 1_000_000,
}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
# "ms" comes before "m" so that "500ms" is not read as 500 minutes followed by garbage.
_PART = re.compile(rf"\s*({_NUMBER})\s*(ms|s|m|h|d|w)\s*", re.IGNORECASE)
_BARE_NUMBER = re.compile(rf"\s*{_NUMBER}\s*")


def parse_duration(value: object, *, name: str) -> datetime.timedelta:
    """Read ``value`` as a duration of zero or more; ``name`` says where it came from in errors.

    Accepts seconds as an int, a float or a numeric string, a ``timedelta``, or a string of
    number-and-unit parts (``ms``, ``s``, ``m``, ``h``, ``d``, ``w``; any case, optional spaces),
    which are added up: ``"1h30m"`` and ``"1d 2h"``.
    """
    if isinstance(value, datetime.timedelta):
        duration = value
    elif isinstance(value, bool):
        # bool is an int subclass; True meaning one second is never what was meant.
        raise ValueError(_not_a_duration(value, name))
    elif isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"{name}: {value!r} is not a finite number of seconds")
        duration = _seconds(value, value, name)
    elif isinstance(value, str):
        # The sign is read apart so that "-5s" is reported as negative rather than as garbage.
        magnitude = value.strip()
        sign = -1 if magnitude.startswith("-") else 1
        duration = sign * _parse_text(magnitude.removeprefix("-"), value, name)
    else:
        raise ValueError(_not_a_duration(value, name))
    if duration < datetime.timedelta(0):
        raise ValueError(f"{name}: {value!r} is negative; a duration must be zero or more")
    return duration


def format_duration(duration: datetime.timedelta) -> str:
    """Compact form for messages and docs, readable back by ``parse_duration``: ``"1h30m"``."""
    if duration < datetime.timedelta(0):
        return "-" + format_duration(-duration)
    if not duration:
        return "0s"
    minutes, seconds = divmod(duration.seconds, 60)
    hours, minutes = divmod(minutes, 60)
    parts = [
        f"{amount}{unit}"
        for amount, unit in (
            (duration.days, "d"),
            (hours, "h"),
            (minutes, "m"),
            (seconds, "s"),
        )
        if amount
    ]
    if duration.microseconds:
        parts.append(f"{duration.microseconds / 1000:g}ms")
    return "".join(parts)


def _parse_text(text: str, value: str, name: str) -> datetime.timedelta:
    """Read the unsigned ``text``; errors quote ``value``, the text as it was given."""
    if _BARE_NUMBER.fullmatch(text):
        return _microseconds(Decimal(text.strip()) * _MICROSECONDS_PER_UNIT["s"], value, name)
    microseconds = Decimal(0)
    position = 0
    while position < len(text):
        part = _PART.match(text, position)
        if part is None:
            raise ValueError(_not_a_duration(value, name))
        amount, unit = part.groups()
        microseconds += Decimal(amount) * _MICROSECONDS_PER_UNIT[unit.lower()]
        position = part.end()
    if position == 0:  # empty or blank text
        raise ValueError(_not_a_duration(value, name))
    return _microseconds(microseconds, value, name)


def _seconds(seconds: float, value: object, name: str) -> datetime.timedelta:
    try:
        return datetime.timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"{name}: {value!r} is too long a duration") from None


def _microseconds(microseconds: Decimal, value: object, name: str) -> datetime.timedelta:
    whole = int(microseconds.to_integral_value(ROUND_HALF_EVEN))
    try:
        return datetime.timedelta(microseconds=whole)
    except OverflowError:
        raise ValueError(f"{name}: {value!r} is too long a duration") from None


def _not_a_duration(value: object, name: str) -> str:
    return f"{name}: {value!r} is not a duration ({UNITS_HINT})"


#: The longest a job is ever put off, by ``Snooze``, a backoff or a rescue: longer delays are
#: cut to it, so that no delay can push a job's time past what PostgreSQL's timestamps hold.
MAX_DELAY = datetime.timedelta(days=36525)
_MAX_DELAY_SECONDS = MAX_DELAY.total_seconds()


def delay_seconds(value: object, *, name: str) -> float:
    """``value`` (seconds, or a ``timedelta``) as a delay: a finite number of seconds of zero or
    more, cut to ``MAX_DELAY``. Anything else raises ``ValueError`` naming ``name``."""
    seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"{name} takes a number of seconds or a timedelta, not {value!r}")
    if seconds != seconds or seconds < 0:  # NaN is the one number unequal to itself
        raise ValueError(f"{name} takes a delay of zero or more seconds, not {value!r}")
    if seconds == math.inf:
        raise ValueError(f"{name} takes a finite delay, not {value!r}")
    # Compared before float(): an int too large for a float is simply too long.
    return _MAX_DELAY_SECONDS if seconds >= _MAX_DELAY_SECONDS else float(seconds)
