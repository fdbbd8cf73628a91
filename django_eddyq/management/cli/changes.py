"""``eddyq retry``, ``eddyq cancel`` and ``eddyq delete``: by ids, or every job of a filter.

Each runs ``django_eddyq.bulk``: the same rule as for one job, a bounded batch at a time, each
batch in its own short transaction. A bulk change needs ids, a filter, or ``--all``; it asks
first on a terminal (``--yes`` not to ask; without a terminal, it refuses unless told
``--yes``); ``--dry-run`` counts what would change and changes nothing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, TextIO

from django_eddyq import bulk, inspection
from django_eddyq.management.cli.output import NOTHING, OK, Progress, Usage, confirm, to_json
from django_eddyq.models import Job
from django_eddyq.selection import JobFilter


@dataclass(frozen=True)
class Change:
    verb: str  # "Retry"
    doing: str  # "Retrying"
    done: str  # "Retried"


CHANGES = {
    "retry": Change("Retry", "Retrying", "Retried"),
    "cancel": Change("Cancel", "Cancelling", "Cancelled"),
    "delete": Change("Delete", "Deleting", "Deleted"),
}


def change(
    name: str,
    selection: JobFilter,
    *,
    stdout: Any,
    stderr: Any,
    stdin: TextIO,
    every: bool,
    dry_run: bool,
    yes: bool,
    batch_size: int,
    as_json: bool,
) -> int:
    what = CHANGES[name]
    if selection.selects_everything and not every:
        raise Usage(
            f"{name}: give job ids, a filter (--state, --queue, --task, --since, --until, "
            f"--search), or --all to {name} every job that can be."
        )
    count, estimated = inspection.estimated_count(selection.apply(Job.objects.all()))
    if not count:
        if as_json:
            stdout.write(to_json({"operation": name, "dry_run": dry_run, "matched": 0}))
        else:
            stderr.write(f"No {selection.describe()}.")
        return NOTHING
    about = "about " if estimated else ""
    if not (dry_run or yes):
        question = f"{what.verb} {about}{count:,} {selection.describe()}? ({bulk.RULES[name]}.)"
        if not confirm(question, stdin=stdin, stderr=stderr):
            stderr.write("Nothing changed.")
            return OK
    bar = Progress(sys.stderr, "Checking" if dry_run else what.doing)
    result = bulk.OPERATIONS[name](
        selection,
        dry_run=dry_run,
        batch_size=batch_size,
        progress=lambda done: bar(done.matched, count),
    )
    bar.end()
    if as_json:
        stdout.write(to_json(result.as_dict()))
    else:
        stdout.write(summary(name, result))
    return OK if result.matched else NOTHING


def summary(name: str, result: bulk.BulkResult) -> str:
    what = CHANGES[name]
    if result.dry_run:
        line = f"Dry run: would {name} {result.changed:,} of {result.matched:,} matching jobs"
    else:
        line = f"{what.done} {result.changed:,} of {result.matched:,} matching jobs"
    if result.cancel_requested:
        line += f" ({result.cancel_requested:,} running: their workers are asked to stop)"
    line += f"; {result.skipped:,} left alone by the rule ({bulk.RULES[name]})."
    if result.sample:
        more = "…" if result.changed > len(result.sample) else ""
        line += "\n" + ("Would change" if result.dry_run else "Changed") + ": "
        line += ", ".join(f"#{job_id}" for job_id in result.sample) + more
    return line
