"""How ``manage.py eddyq`` answers: tables for people, JSON for scripts, a progress bar and a
confirmation on a terminal, and the exit status."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, TextIO

from django.core.management.base import OutputWrapper

from django_eddyq.durations import format_duration

#: Exit statuses: done; nothing matched, or the queue is unhealthy; bad usage.
OK, NOTHING, USAGE = 0, 1, 2

#: The widest a table's cell gets before it is cut short, in characters.
CELL_WIDTH = 60


class Usage(Exception):
    """The command was used wrongly; the message says how (exit status 2)."""


def to_json(value: Any, *, one_line: bool = False) -> str:
    return json.dumps(
        value, default=_json_default, indent=None if one_line else 2, ensure_ascii=False
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return sorted(value) if isinstance(value, set | frozenset) else list(value)
    return str(value)


def cell(value: Any) -> str:
    """A value as a table shows it: dashes for nothing, times to the second, one line."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S%z").replace("+0000", "Z")
    if isinstance(value, int):
        return f"{value:,}"
    text = " ".join(str(value).split())
    return text if len(text) <= CELL_WIDTH else text[: CELL_WIDTH - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` under ``headers``, columns padded; numbers right-aligned."""
    cells = [[cell(value) for value in row] for row in rows]
    numeric = [
        all(
            isinstance(row[column], int | float) and not isinstance(row[column], bool)
            for row in rows
            if row[column] is not None
        )
        and any(row[column] is not None for row in rows)
        for column in range(len(headers))
    ]
    widths = [
        max([len(header), *(len(row[column]) for row in cells)])
        for column, header in enumerate(headers)
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            value.rjust(width) if right else value.ljust(width)
            for value, width, right in zip(values, widths, numeric, strict=True)
        ).rstrip()

    return "\n".join([line(headers), *(line(row) for row in cells)])


def ago(seconds: float | None) -> str:
    """How long ago, or how long a wait: tenths under 10 s, then whole units."""
    if seconds is None:
        return "—"
    if math.isinf(seconds):
        return "forever"
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.1f}s"
    return format_duration(timedelta(seconds=round(seconds)))


class Progress:
    """A progress bar on a terminal's stderr, redrawn at most a few times a second; nothing
    elsewhere (a script's log gets the summary line only)."""

    REDRAW_SECONDS = 0.2
    WIDTH = 30

    def __init__(self, stream: TextIO, verb: str) -> None:
        self.stream = stream
        self.verb = verb
        self.shown = stream.isatty()
        self._drawn_at = 0.0

    def __call__(self, done: int, total: int | None) -> None:
        if not self.shown:
            return
        now = time.monotonic()
        if now - self._drawn_at < self.REDRAW_SECONDS and (total is None or done < total):
            return
        self._drawn_at = now
        if total:
            filled = min(round(self.WIDTH * done / total), self.WIDTH)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            self.stream.write(f"\r{self.verb} [{bar}] {done:,} of about {total:,}")
        else:
            self.stream.write(f"\r{self.verb} {done:,}")
        self.stream.flush()

    def end(self) -> None:
        if self.shown and self._drawn_at:
            self.stream.write("\n")
            self.stream.flush()


def confirm(question: str, *, stdin: TextIO, stderr: OutputWrapper) -> bool:
    """Ask on the terminal; without one, refuse (a script says ``--yes``)."""
    if not stdin.isatty():
        raise Usage(f"{question} Not asked: stdin is not a terminal. Add --yes to go ahead.")
    stderr.write(f"{question} [y/N] ", ending="")
    stderr.flush()
    answer = stdin.readline()
    return answer.strip().lower() in {"y", "yes"}
