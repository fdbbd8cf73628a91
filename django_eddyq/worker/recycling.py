"""``--max-jobs`` and ``--max-memory``: when a worker process should make way for a fresh one.

A worker that reaches either limit takes no more jobs, lets those it holds end, and stops (see
``Worker.recycle``); its supervisor starts another in its place, or, running alone, it exits 0
for the process manager to start another. Memory is looked at only after jobs end, so that every
process runs at least one job however large it started.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time

from django_eddyq.vocabulary import validate_positive_int

# Reading the process's size costs a file read: not more often than this.
MEMORY_CHECK_SECONDS = 1.0
MIB = 1024 * 1024


class Recycling:
    """The limits of one worker process, and how far it has come towards them.

    Only the worker's main thread uses it.
    """

    def __init__(self, *, max_jobs: int | None = None, max_memory_mib: int | None = None) -> None:
        self.max_jobs = None if max_jobs is None else validate_positive_int(max_jobs, "max_jobs")
        self.max_memory_mib = (
            None
            if max_memory_mib is None
            else validate_positive_int(max_memory_mib, "max_memory_mib")
        )
        self.taken = 0  # jobs claimed and started
        self._finished_seen = 0
        self._memory_checked_at = -math.inf

    def may_take(self) -> bool:
        return self.max_jobs is None or self.taken < self.max_jobs

    def cap(self, claim: int) -> int:
        """``claim``, lowered so that the worker takes no more than ``max_jobs`` in all."""
        if self.max_jobs is None:
            return claim
        return max(min(claim, self.max_jobs - self.taken), 0)

    def reason(self, finished: int) -> str | None:
        """Why the worker should be replaced now, if it should; ``finished`` is how many of its
        jobs have ended so far."""
        if not self.may_take():
            return f"it has taken its {self.max_jobs} jobs (max jobs {self.max_jobs})"
        if self.max_memory_mib is None or finished == self._finished_seen:
            return None
        now = time.monotonic()
        if now - self._memory_checked_at < MEMORY_CHECK_SECONDS:
            return None
        self._finished_seen = finished
        self._memory_checked_at = now
        used = resident_mib()
        if used >= self.max_memory_mib:
            return f"it uses {used:.0f} MiB (max memory {self.max_memory_mib} MiB)"
        return None


def resident_mib() -> float:
    """This process's resident memory in MiB, pages it shares with its supervisor included. On
    a system without ``/proc``, its peak: the most POSIX tells."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # Bytes on macOS, KiB elsewhere.
        return peak / MIB if sys.platform == "darwin" else peak / 1024
    return pages * os.sysconf("SC_PAGE_SIZE") / MIB
