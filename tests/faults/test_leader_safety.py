"""Never two leaders: the leader SIGKILLed and SIGSTOPped (it wakes after its lease) repeatedly.

Each maintenance pass logs, at DEBUG, its service, its leader and its time window (epoch
seconds); the fleet's processes all run on this machine, so their clocks agree. No pass of one
leader may overlap a pass of another, and once a leader is lost a pass of the next one must start
within one lease, plus one renew interval (how often followers campaign) and a little slack for
a busy machine.
"""

from __future__ import annotations

import itertools
import signal
import time

import psycopg
import pytest
from django.db import connection

from tests.faults.conftest import (
    LEASE,
    RENEW_INTERVAL,
    Fleet,
    PassWindow,
    WorkerProcess,
    current_leader,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

SLACK = 0.7
TAKEOVER = LEASE + RENEW_INTERVAL + SLACK


def overlaps(windows: list[PassWindow]) -> list[tuple[PassWindow, PassWindow]]:
    """Pairs of passes of different leaders whose time windows overlap."""
    found = []
    active: list[PassWindow] = []
    for window in sorted(windows, key=lambda w: w.start):
        active = [other for other in active if other.end > window.start]
        found.extend((other, window) for other in active if other.leader != window.leader)
        active.append(window)
    return found


def the_leader(workers: list[WorkerProcess]) -> tuple[WorkerProcess, str]:
    """The process of ``workers`` that holds the leader lease, and its worker id."""
    found: list[tuple[WorkerProcess, str]] = []

    def one_leads() -> bool:
        leader = current_leader()
        found[:] = [(w, leader) for w in workers if leader and leader in w.worker_ids()]
        return bool(found)

    wait_until(one_leads, LEASE * 3, "one of the workers to lead")
    return found[0]


def first_pass_after(fleet: Fleet, moment: float, lost: str) -> PassWindow:
    """The first pass, after ``moment``, of a leader other than ``lost``."""

    def passes() -> list[PassWindow]:
        return [w for w in fleet.pass_windows() if w.start >= moment and w.leader != lost]

    wait_until(passes, TAKEOVER + 5, "maintenance to resume under another leader")
    return passes()[0]


def test_killed_and_paused_leaders_never_run_maintenance_alongside_another(
    fleet: Fleet, fault_environment: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Passes every lease rather than several times a second: they are few and short (a few
    # milliseconds), so the pauses land between passes. A pause in the middle of a pass is
    # the next test's.
    fault_environment.update(EDDYQ_RESCUE_INTERVAL="2s", EDDYQ_SCHEDULER_INTERVAL="2s")
    # The reindexer rebuilds an index every second, its passes fenced like the others'.
    fault_environment.update(
        EDDYQ_REINDEX_SCHEDULE="* * * * * *", EDDYQ_REINDEX_INDEXES="eddyq_jobs_due_idx"
    )
    workers = [fleet.start("--concurrency", "1") for _ in range(3)]
    resumed_after: list[float] = []
    for how in ["SIGKILL", "SIGSTOP", "SIGKILL", "SIGSTOP", "SIGSTOP"]:
        leader, leader_id = the_leader(workers)
        time.sleep(0.7)  # it runs a few passes as leader
        assert current_leader() == leader_id
        lost_at = time.time()
        if how == "SIGKILL":
            leader.signal(signal.SIGKILL)
            leader.wait(10)
            workers[workers.index(leader)] = fleet.start("--concurrency", "1")
        else:
            leader.signal(signal.SIGSTOP)
        resumed_after.append(first_pass_after(fleet, lost_at, leader_id).start - lost_at)
        if how == "SIGSTOP":
            time.sleep(0.5)  # the new leader runs passes while the old one is frozen
            leader.signal(signal.SIGCONT)
            wait_until(
                lambda paused=leader: "stepping down" in paused.text(),
                5,
                "the woken leader to step down",
            )
            assert current_leader() != leader_id
    time.sleep(1.0)

    assert all(worker.alive() for worker in workers)
    windows = fleet.pass_windows()
    handovers = sum(a.leader != b.leader for a, b in itertools.pairwise(windows))
    assert handovers >= 5, f"expected 5 handovers of maintenance, saw {handovers}"
    reindexed_by = {window.leader for window in windows if window.service == "reindexer"}
    assert len(reindexed_by) >= 3, f"the reindexer ran under {len(reindexed_by)} leaders"
    assert overlaps(windows) == []
    assert max(resumed_after) < TAKEOVER, resumed_after
    with capsys.disabled():
        print(
            f"\nleader safety: {len(windows)} passes, {handovers} handovers, no overlap; "
            "maintenance resumed after " + ", ".join(f"{seconds:.2f}s" for seconds in resumed_after)
        )


def test_a_leader_frozen_in_the_middle_of_a_pass_does_not_finish_it_beside_its_successor(
    fleet: Fleet, fault_environment: dict[str, str]
) -> None:
    """A pass in flight when its process is paused must not go on once its lease has passed.

    The pause is made to land in a pass: while this test holds an exclusive lock on the job
    table, the leader's rescuer waits on it in the middle of a pass. The leader is
    frozen, its lease runs out and the other process takes over; only then does the lock go.
    Whatever the frozen leader had sent now runs in the database alongside its successor's
    passes, unless its passes are fenced by its lease (for instance, by statement and
    idle-in-transaction timeouts that end with the lease, so the server cancels them).
    """
    first = fleet.start("--concurrency", "1")
    first_id = first.worker_id()
    wait_until(lambda: current_leader() == first_id, LEASE * 3, "the first worker to lead")
    second = fleet.start("--concurrency", "1")
    second_id = second.worker_id()

    with psycopg.connect(fault_environment["DATABASE_URL"].split("?")[0]) as locker:
        locker.execute("LOCK TABLE eddyq_jobs IN ACCESS EXCLUSIVE MODE")

        def rescuer_waits() -> bool:
            # The rescuer's search for stuck jobs, in a pass: only the leader runs it now.
            # (Asked on another connection: within the locker's transaction, pg_stat_activity
            # would keep showing its first snapshot.)
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    " AND query LIKE %s",
                    ["%locked_until <%"],
                )
                return bool(cursor.fetchone()[0])

        wait_until(rescuer_waits, 5, "the leader's rescuer to wait on the lock, mid-pass")
        first.signal(signal.SIGSTOP)
        frozen_at = time.time()
        wait_until(lambda: current_leader() == second_id, TAKEOVER + 5, "the takeover")
        locker.rollback()  # the lock goes: what both leaders sent runs now
    time.sleep(1.0)
    first.signal(signal.SIGCONT)
    wait_until(lambda: "stepping down" in first.text(), 5, "the woken leader to step down")
    time.sleep(1.0)

    windows = fleet.pass_windows()
    assert any(w.leader == second_id and w.start > frozen_at for w in windows)
    assert overlaps(windows) == []
