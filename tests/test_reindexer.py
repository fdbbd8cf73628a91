"""The reindexer and the E007 check of REINDEX_INDEXES.

REINDEX CONCURRENTLY cannot run inside a transaction, so the tests that rebuild use
``transaction=True``; indexes they create by hand are dropped again, since flushing the
tables between tests would not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from django.core.checks import Tags, run_checks
from django.db import OperationalError, connection
from django.db.transaction import TransactionManagementError
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_eddyq import checks
from django_eddyq.db import connect
from django_eddyq.maintenance.reindexer import Reindexer

DEFAULT_INDEXES = (
    "eddyq_jobs_claim_idx",
    "eddyq_jobs_queue_claim_idx",
    "eddyq_jobs_due_idx",
    "eddyq_jobs_lease_idx",
)


def indexes(*names: str) -> Any:
    return override_settings(EDDYQ={"REINDEX_INDEXES": list(names)})


def query(statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall()) if cursor.description else []


def filenode(index: str) -> int:
    [(node,)] = query("SELECT pg_relation_filenode(%s::regclass)", [index])
    assert isinstance(node, int)
    return node


def index_names() -> set[str]:
    rows = query(
        "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'eddyq_jobs'::regclass"
    )
    return {name for (name,) in rows}


def is_valid(index: str) -> bool:
    [(valid,)] = query("SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", [index])
    return bool(valid)


def make_invalid_index(name: str) -> None:
    """What an interrupted REINDEX CONCURRENTLY leaves: an invalid index (needs a superuser)."""
    query(f'CREATE INDEX "{name}" ON eddyq_jobs (run_at)')
    query("UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass", [name])


@pytest.fixture
def hand_made_indexes() -> Iterator[list[str]]:
    """Names of indexes a test creates; whichever still exist are dropped afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        query(f'DROP INDEX IF EXISTS "{name}"')


# Rebuilding.


@pytest.mark.django_db(transaction=True)
def test_rebuilds_the_index() -> None:
    before = filenode("eddyq_jobs_due_idx")
    with indexes("eddyq_jobs_due_idx"):
        assert Reindexer().run_once() == 1
    assert filenode("eddyq_jobs_due_idx") != before
    assert is_valid("eddyq_jobs_due_idx")


@pytest.mark.django_db(transaction=True)
def test_rebuilds_every_default_index_one_at_a_time() -> None:
    before = {name: filenode(name) for name in DEFAULT_INDEXES}
    names = index_names()
    assert Reindexer().planned() == [
        f'REINDEX INDEX CONCURRENTLY "public"."{name}"' for name in DEFAULT_INDEXES
    ]
    assert Reindexer().run_once() == 4
    assert all(filenode(name) != node for name, node in before.items())
    assert index_names() == names  # no leftover of the rebuilds


@pytest.mark.django_db(transaction=True)
def test_skips_unknown_names_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    before = filenode("eddyq_jobs_lease_idx")
    not_ours = "eddyq_batches_finalized_idx"  # an index, but of another table
    with (
        indexes("no_such_idx", not_ours, "eddyq_jobs_lease_idx"),
        caplog.at_level(logging.INFO, "django_eddyq"),
    ):
        assert Reindexer().run_once() == 1
    assert filenode("eddyq_jobs_lease_idx") != before
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "'no_such_idx'" in warnings[0]
    assert f"'{not_ours}'" in warnings[1]


@pytest.mark.django_db(transaction=True)
def test_names_are_identifiers_not_sql(caplog: pytest.LogCaptureFixture) -> None:
    with indexes('eddyq_jobs_due_idx"; DROP TABLE eddyq_jobs; --', "public.eddyq_jobs_due_idx"):
        assert Reindexer().run_once() == 0
    assert "eddyq_jobs_due_idx" in index_names()


@pytest.mark.django_db(transaction=True)
def test_drops_invalid_leftovers_before_rebuilding(hand_made_indexes: list[str]) -> None:
    hand_made_indexes += [
        "eddyq_jobs_due_idx_ccnew",
        "eddyq_jobs_due_idx_ccold1",
        "eddyq_jobs_due_idx_ccnew2",
        "eddyq_jobs_due_idx_copy",
    ]
    make_invalid_index("eddyq_jobs_due_idx_ccnew")
    make_invalid_index("eddyq_jobs_due_idx_ccold1")
    query('CREATE INDEX "eddyq_jobs_due_idx_ccnew2" ON eddyq_jobs (run_at)')  # valid: in use
    make_invalid_index("eddyq_jobs_due_idx_copy")  # not a name REINDEX would leave
    with indexes("eddyq_jobs_due_idx"):
        assert Reindexer().planned() == [
            'DROP INDEX CONCURRENTLY IF EXISTS "public"."eddyq_jobs_due_idx_ccnew"',
            'DROP INDEX CONCURRENTLY IF EXISTS "public"."eddyq_jobs_due_idx_ccold1"',
            'REINDEX INDEX CONCURRENTLY "public"."eddyq_jobs_due_idx"',
        ]
        assert Reindexer().run_once() == 3
        assert Reindexer().planned() == ['REINDEX INDEX CONCURRENTLY "public"."eddyq_jobs_due_idx"']
    remaining = index_names()
    assert "eddyq_jobs_due_idx_ccnew" not in remaining
    assert "eddyq_jobs_due_idx_ccold1" not in remaining
    assert {"eddyq_jobs_due_idx_ccnew2", "eddyq_jobs_due_idx_copy"} <= remaining


@pytest.mark.django_db(transaction=True)
def test_skips_while_an_index_build_is_under_way(
    caplog: pytest.LogCaptureFixture, hand_made_indexes: list[str]
) -> None:
    """A CREATE INDEX CONCURRENTLY waiting on a writer stands for a rebuild in progress, whose
    unfinished index would look like a leftover: nothing is dropped or rebuilt meanwhile."""
    hand_made_indexes += ["eddyq_jobs_building_idx", "eddyq_jobs_due_idx_ccnew"]
    make_invalid_index("eddyq_jobs_due_idx_ccnew")
    before = filenode("eddyq_jobs_due_idx")
    failures: list[BaseException] = []

    def build() -> None:
        try:
            with connect() as builder:
                builder.execute(
                    "CREATE INDEX CONCURRENTLY eddyq_jobs_building_idx ON eddyq_jobs (task)"
                )
        except BaseException as error:
            failures.append(error)

    with connect() as writer, writer.transaction():
        writer.execute("LOCK TABLE eddyq_jobs IN ROW EXCLUSIVE MODE")
        builder = threading.Thread(target=build)
        builder.start()
        deadline = time.monotonic() + 30
        while not query(
            "SELECT 1 FROM pg_stat_progress_create_index WHERE relid = 'eddyq_jobs'::regclass"
        ):
            assert time.monotonic() < deadline, "the index build never started"
            time.sleep(0.02)
        with indexes("eddyq_jobs_due_idx"), caplog.at_level(logging.INFO, "django_eddyq"):
            assert Reindexer().planned() == []
            assert Reindexer().run_once() == 0
    builder.join(30)
    assert not failures
    assert filenode("eddyq_jobs_due_idx") == before
    assert "eddyq_jobs_due_idx_ccnew" in index_names()
    assert any("under way" in record.getMessage() for record in caplog.records)


def rebuild_waiting_on_a_lock(service: Reindexer, held_for: float) -> tuple[int, float]:
    """A fenced rebuild of one index while another session holds a lock it waits for, for
    ``held_for`` seconds: how many it rebuilt, and how long the pass took."""
    with (
        indexes("eddyq_jobs_due_idx"),
        psycopg.connect(**connection.get_connection_params()) as locker,
    ):
        locker.execute("LOCK TABLE eddyq_jobs IN SHARE UPDATE EXCLUSIVE MODE")
        release = threading.Timer(held_for, locker.rollback)
        started = time.monotonic()
        release.start()
        try:
            count = service.fenced_pass(service.run_once)
            took = time.monotonic() - started
        finally:
            release.join()
        return count, took


@pytest.mark.django_db(transaction=True)
def test_a_rebuild_may_outlast_the_lease_left_when_it_started(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A REINDEX is not cut by a statement timeout of the lease left at its start (a big
    index takes longer than that) while this process still holds the lease."""
    caplog.set_level(logging.DEBUG, "django_eddyq")
    service = Reindexer()
    service.lease_left = lambda: 0.3  # renewed all along
    before = filenode("eddyq_jobs_due_idx")
    count, took = rebuild_waiting_on_a_lock(service, held_for=1.0)
    assert count == 1 and took >= 1.0
    assert filenode("eddyq_jobs_due_idx") != before
    assert "eddyq reindexer: pass by leader" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_rebuild_is_cancelled_once_the_lease_is_lost(caplog: pytest.LogCaptureFixture) -> None:
    service = Reindexer()
    lease_ends = time.monotonic() + 0.5
    service.lease_left = lambda: max(lease_ends - time.monotonic(), 0.0)
    before = filenode("eddyq_jobs_due_idx")
    count, took = rebuild_waiting_on_a_lock(service, held_for=3.0)
    assert count == 0
    assert "pass cut short, the leader lease ran out" in caplog.text
    assert filenode("eddyq_jobs_due_idx") == before
    assert is_valid("eddyq_jobs_due_idx")
    assert 0.5 <= took < 2.0  # cancelled as the lease ended, not when the lock went
    service.on_stop()


@pytest.mark.django_db
def test_refuses_to_run_inside_a_transaction() -> None:
    with pytest.raises(TransactionManagementError, match="CONCURRENTLY"):
        Reindexer().run_once()
    # Planning only reads the catalog: fine inside a transaction, as for a dry run.
    assert len(Reindexer().planned()) == 4


# Scheduling.


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def reindexer(monkeypatch: pytest.MonkeyPatch) -> tuple[Reindexer, Clock, list[datetime]]:
    """A reindexer on a fake database clock, recording its passes instead of rebuilding."""
    clock = Clock(datetime(2026, 3, 1, 22, 30, tzinfo=UTC))
    passes: list[datetime] = []
    service = Reindexer()
    monkeypatch.setattr(service, "database_now", clock)

    def run_once(now: datetime | None = None) -> int:
        passes.append(clock.now)
        return 4

    monkeypatch.setattr(service, "run_once", run_once)
    return service, clock, passes


def test_interval_is_none_when_disabled() -> None:
    assert Reindexer().interval() == 3600.0
    with override_settings(EDDYQ={"REINDEX_SCHEDULE": None}):
        assert Reindexer().interval() is None


def test_loop_waits_for_the_schedule_by_the_database_clock(
    reindexer: tuple[Reindexer, Clock, list[datetime]],
) -> None:
    service, clock, passes = reindexer
    assert service.loop_pass() == 0  # never on start
    assert service.due == datetime(2026, 3, 2, tzinfo=UTC)
    assert service.next_delay(3600.0) == 3600.0  # looks again within the hour
    clock.now = datetime(2026, 3, 1, 23, 45, tzinfo=UTC)
    assert service.next_delay(3600.0) == 900.0
    assert service.loop_pass() == 0
    clock.now = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
    assert service.loop_pass() == 4
    assert passes == [clock.now]
    assert service.due == datetime(2026, 3, 3, tzinfo=UTC)
    assert service.loop_pass() == 0
    assert passes == [clock.now]


def test_late_wake_still_rebuilds_once(reindexer: tuple[Reindexer, Clock, list[datetime]]) -> None:
    service, clock, passes = reindexer
    service.loop_pass()
    clock.now = datetime(2026, 3, 4, 7, 0, tzinfo=UTC)  # slept through two midnights
    assert service.loop_pass() == 4
    assert service.loop_pass() == 0
    assert len(passes) == 1
    assert service.due == datetime(2026, 3, 5, tzinfo=UTC)
    assert service.next_delay(3600.0) == 3600.0
    clock.now = datetime(2026, 3, 5, 0, 0, 1, tzinfo=UTC)
    assert service.next_delay(3600.0) == 0.0


def test_schedule_is_read_in_utc(reindexer: tuple[Reindexer, Clock, list[datetime]]) -> None:
    service, clock, _ = reindexer
    # The same instant, as a database in another time zone might report it.
    clock.now = datetime(2026, 3, 1, 22, 30, tzinfo=UTC).astimezone(timezone(timedelta(hours=-5)))
    with override_settings(EDDYQ={"REINDEX_SCHEDULE": "30 3 * * *"}):
        service.loop_pass()
    assert service.due == datetime(2026, 3, 2, 3, 30, tzinfo=UTC)


def test_changed_schedule_is_followed(reindexer: tuple[Reindexer, Clock, list[datetime]]) -> None:
    service, clock, passes = reindexer
    service.loop_pass()
    with override_settings(EDDYQ={"REINDEX_SCHEDULE": "0 23 * * *"}):
        assert service.loop_pass() == 0
        assert service.due == datetime(2026, 3, 1, 23, 0, tzinfo=UTC)
        clock.now = datetime(2026, 3, 1, 23, 0, tzinfo=UTC)
        assert service.loop_pass() == 4
    with override_settings(EDDYQ={"REINDEX_SCHEDULE": None}):
        assert service.loop_pass() == 0
        assert service.due is None
    assert len(passes) == 1


def test_not_the_leader_no_rebuild(reindexer: tuple[Reindexer, Clock, list[datetime]]) -> None:
    service, clock, passes = reindexer
    service.lease_left = lambda: 0.0
    service.loop_pass()
    clock.now = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
    assert service.loop_pass() == 0
    assert passes == []
    assert service.due == datetime(2026, 3, 3, tzinfo=UTC)


@pytest.mark.django_db
def test_database_now_is_the_database_clock_in_utc() -> None:
    [(database_now,)] = query("SELECT now()")
    now = Reindexer().database_now()
    assert now == database_now
    assert now.utcoffset() == timedelta(0)


# E007: REINDEX_INDEXES names only indexes of eddyq_jobs.


def check(databases: list[str] | None = None) -> list[Any]:
    return checks.check_reindex_indexes(databases=databases or ["default"])


@pytest.mark.django_db
def test_check_accepts_the_defaults_without_asking_the_database() -> None:
    """The migrations create them; a worker runs this check before its first claim."""
    with CaptureQueriesContext(connection) as queries:
        assert check() == []
    assert len(queries) == 0


@pytest.mark.django_db
def test_check_reports_names_that_are_not_indexes_of_eddyq_jobs() -> None:
    with indexes("eddyq_jobs_due_idx", "no_such_idx", "eddyq_batches_finalized_idx"):
        messages = check()
    assert [message.id for message in messages] == ["django_eddyq.E007"] * 2
    assert "'no_such_idx'" in messages[0].msg
    assert "'eddyq_batches_finalized_idx'" in messages[1].msg


@pytest.mark.django_db
def test_check_runs_with_the_database_tag_only() -> None:
    with indexes("no_such_idx"):
        assert "django_eddyq.E007" in {
            m.id for m in run_checks(tags=[Tags.database], databases=["default"])
        }
        assert "django_eddyq.E007" not in {m.id for m in run_checks(tags=[checks.TAG])}


def test_check_says_nothing_without_the_queue_database() -> None:
    with indexes("no_such_idx"):
        assert checks.check_reindex_indexes(databases=None) == []
        assert checks.check_reindex_indexes(databases=["other"]) == []


@pytest.mark.django_db
def test_check_says_nothing_before_migrate() -> None:
    query("ALTER TABLE eddyq_jobs RENAME TO eddyq_jobs_elsewhere")  # rolled back after the test
    with indexes("no_such_idx"):
        assert check() == []


def test_check_says_nothing_when_the_database_is_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unreachable() -> Any:
        raise OperationalError("connection refused")

    monkeypatch.setattr(connection, "cursor", unreachable)
    with indexes("no_such_idx"):
        assert check() == []
