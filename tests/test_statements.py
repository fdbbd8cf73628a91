"""docs/statements.sql: every statement the package can send, as PostgreSQL receives it.

``django_eddyq/sql.py`` writes most statements out in full, but some are rendered at run time:
the variants of a function or template (the claim's LIMIT and queue filter, the insert's queue
touch and unique conflict, ...), the expiry conditions composed for the cleaner and the
overview, identifiers composed with ``psycopg.sql``. ``docs/statements.sql`` holds each
statement and each variant, rendered as the package renders it, after a comment naming it, so
that a reviewer reads in one committed file what the database is sent, and sees in a diff what
a change does to it. This test fails when the file is stale; rewrite it with

    EDDYQ_WRITE_STATEMENTS=1 .venv/bin/python -m pytest tests/test_statements.py

It also fails when a public name of ``sql.py`` is rendered under no comment: a new statement
cannot be forgotten.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from psycopg import sql as psql

from django_eddyq import checks, db, sql
from django_eddyq.inspection import state_counts_query
from django_eddyq.retention import job_expiries
from django_eddyq.vocabulary import TERMINAL_STATES, JobState

STATEMENTS = Path(__file__).resolve().parents[1] / "docs" / "statements.sql"
WRITE = "EDDYQ_WRITE_STATEMENTS"
REWRITE = f"{WRITE}=1 .venv/bin/python -m pytest tests/test_statements.py"

HEADER = f"""\
-- Every statement django-eddyq sends, as PostgreSQL receives it: each constant of
-- django_eddyq/sql.py, and each variant that its functions and templates render, after a
-- comment naming it. Named parameters show as %(name)s, positional ones as %s: those of the
-- SQL that Django compiles into its own queries, and of the statements built around it.
-- The newlines around each statement are left out.
--
-- Written by tests/test_statements.py, which fails when this file is stale. Do not edit it:
-- change sql.py, then rewrite it with
--     {REWRITE}
"""

# Every terminal state with a RETENTION, so that each has the condition of its default.
RETENTION = {state: timedelta(days=1) for state in TERMINAL_STATES}
# The queues a claim is rendered for: None is any queue.
CLAIM_QUEUES = {"any queue": None, "one queue": ["default"], "several queues": ["a", "b"]}
SAMPLE_INDEX = psql.Identifier("public", "eddyq_jobs_claim_idx")
SAMPLE_LEFTOVER = psql.Identifier("public", "eddyq_jobs_claim_idx_ccnew")

type Rendered = Iterator[tuple[str, str]]


def composed(statement: psql.Composable) -> str:
    """psycopg.sql as text, quoted without a connection as it would be with one."""
    return statement.as_string(None)


def enqueue() -> Rendered:
    yield "sql.INSERT_ONE_JOB", sql.INSERT_ONE_JOB
    for (touch, unique), statement in sql.INSERT_JOBS.items():
        queues = "queue rows touched" if touch else "no queue touch"
        keys = "unique keys" if unique else "no unique key"
        yield f"sql.INSERT_JOBS ({queues}, {keys})", statement
    for name in ("RESERVE_JOB_IDS", "COPY_JOBS", "COPY_JOBS_RUN_AT_NOW"):
        yield f"sql.{name}", getattr(sql, name)
    for name in ("CREATE_AND_TOUCH_QUEUES", "NOTIFY_NEW_JOBS", "RELEASE_UNIQUE_KEYS"):
        yield f"sql.{name}", getattr(sql, name)


def worker_pass() -> Rendered:
    yield "sql.TOUCH_QUEUES", sql.TOUCH_QUEUES
    yield "sql.CLAIM_WITHOUT_SORT", sql.CLAIM_WITHOUT_SORT
    for limit in (1, 16):
        for which, queues in CLAIM_QUEUES.items():
            statement = sql.claim_statement(limit, queues)
            yield f"sql.claim_statement (limit {limit}, {which})", statement
    for name in (
        "LIMITED_QUEUES",
        "LOCK_LIMITS",
        "LIMITED_CLAIM_WITHOUT_SORT",
        "LIMITED_CLAIM_GENERIC_PLANS",
    ):
        yield f"sql.{name}", getattr(sql, name)
    for which, queues in CLAIM_QUEUES.items():
        statement = sql.limited_claim_statement(queues)
        yield f"sql.limited_claim_statement ({which})", statement
    statement = sql.limited_claim_statement(None, others=False)
    yield "sql.limited_claim_statement (limited queues only)", statement
    for which, queues in (("any queue", None), ("given queues", ["default", "emails"])):
        yield f"sql.lock_keys_statement ({which})", sql.lock_keys_statement(queues)
        statement = sql.limited_claim_statement(queues, keyed=True)
        yield f"sql.limited_claim_statement ({which}, keyed)", statement
    for name in (
        "FINISH_JOBS",
        "FINISH_ATOMIC_JOB",
        "HEARTBEAT",
        "HAND_BACK_STRAYS",
        "WORKER_SEEN",
        "WORKER_STOPPED",
    ):
        yield f"sql.{name}", getattr(sql, name)
    for name in ("PROMOTE_DUE_ANY_QUEUE", "PROMOTE_DUE_FROM_QUEUES"):
        yield f"sql.{name}", getattr(sql, name)


def maintenance() -> Rendered:
    for name in (
        "SELECT_STUCK_JOBS",
        "RESCUE_JOBS",
        "SET_ASIDE_STUCK_JOB",
        "NEXT_DUE_IN",
        "DATABASE_NOW",
        "LOCK_PERIODIC_SCHEDULE",
        "START_PERIODIC_SCHEDULE",
        "ADVANCE_PERIODIC_SCHEDULE",
        "SELECT_PERIODIC_SCHEDULES",
        "FORGET_PERIODIC_SCHEDULES",
        "LIST_PERIODIC_SCHEDULES",
        "SET_PERIODIC_ENABLED",
    ):
        yield f"sql.{name}", getattr(sql, name)


def election() -> Rendered:
    for name in (
        "ENSURE_LEADER_ROW",
        "CAMPAIGN_FOR_LEADER",
        "FENCE_TIMEOUTS",
        "RESTORE_TIMEOUTS",
        "SET_LOCAL_STATEMENT_TIMEOUT",
        "RESIGN_LEADER",
    ):
        yield f"sql.{name}", getattr(sql, name)


def retention() -> Rendered:
    bare = job_expiries(RETENTION)
    cleaners = job_expiries(RETENTION, now=sql.NOW_POSITIONAL, now_params=(None,))
    for expiry, cleaners_expiry in zip(bare, cleaners, strict=True):
        name = "JOB_EXPIRED_BY_OVERRIDE" if expiry.override else "JOB_EXPIRED_BY_DEFAULT"
        where = "the overview and Job.objects, with its columns as Django compiles them"
        yield f"sql.{name} ({expiry.state}, at now(): {where})", expiry.sql
        where = "the cleaner"
        yield f"sql.{name} ({expiry.state}, at sql.NOW_POSITIONAL: {where})", cleaners_expiry.sql
    yield "sql.BATCH_EXPIRED", sql.BATCH_EXPIRED
    first = cleaners[0]
    for table, condition, what in (
        ("eddyq_jobs", first.sql, f"{first.state} jobs on RETENTION"),
        ("eddyq_batches", sql.BATCH_EXPIRED, "sql.BATCH_EXPIRED"),
    ):
        for resume, batch in ((False, "first batch"), (True, "later batch")):
            statement = sql.delete_expired_statement(table, condition, resume=resume)
            yield f"sql.delete_expired_statement ({table}, {what}, {batch})", composed(statement)
    yield "sql.DELETE_STALE_QUEUES", sql.DELETE_STALE_QUEUES
    yield "sql.DELETE_FORGOTTEN_WORKERS", sql.DELETE_FORGOTTEN_WORKERS
    yield "sql.DELETE_FULL_RATE_BUCKETS", sql.DELETE_FULL_RATE_BUCKETS
    for name in (
        "REINDEX_FIND_INDEX",
        "REINDEX_UNKNOWN_INDEXES",
        "REINDEX_BUILDS_IN_PROGRESS",
        "REINDEX_LEFTOVERS",
    ):
        yield f"sql.{name}", getattr(sql, name)
    for name, index in (("REINDEX_INDEX", SAMPLE_INDEX), ("DROP_LEFTOVER_INDEX", SAMPLE_LEFTOVER)):
        statement = psql.SQL(getattr(sql, name)).format(index=index)
        yield f"sql.{name} (index {composed(index)})", composed(statement)


def queues_and_batches() -> Rendered:
    for name in (
        "SET_QUEUE_PAUSED",
        "SET_QUEUE_LIMITS",
        "NOTIFY_QUEUE",
        "CANCEL_JOBS",
        "RETRY_JOBS",
        "DELETE_JOBS",
        "CANCELLABLE_JOBS",
        "RETRIABLE_JOBS",
        "DELETABLE_JOBS",
        "JOB_ID_RANGE",
        "JOB_STATE",
        "LOCK_PENDING_BATCHES",
        "COMPLETE_BATCHES",
        "SEAL_BATCH",
        "SET_BATCH_CALLBACK_JOB",
    ):
        yield f"sql.{name}", getattr(sql, name)


def workflows() -> Rendered:
    for name in (
        "INSERT_WORKFLOW",
        "ADD_WORKFLOW_STEPS",
        "LOCK_UPSTREAM_STEPS",
        "END_STEPS",
        "CANCEL_DEPENDENTS",
        "RELEASE_DEPENDENTS",
        "WORKFLOW_PROGRESS",
        "REOPEN_STEPS",
        "LOCK_STEPS",
        "RECOUNT_STEPS",
        "FAILED_UPSTREAMS",
        "UNFINISHED_STEPS",
        "FAILED_STEPS",
        "MARK_WORKFLOW_CANCELLED",
        "CURRENT_STEP",
        "DEPENDENCY_RESULTS",
        "STEP_RESULT",
        "DELETE_EXPIRED_WORKFLOWS",
        "WORKFLOW_EXPIRED",
    ):
        yield f"sql.{name}", getattr(sql, name)


def inspection() -> Rendered:
    yield "sql.TABLE_ESTIMATE", sql.TABLE_ESTIMATE
    yield "sql.STATE_STATISTICS", sql.STATE_STATISTICS
    statement, _params = state_counts_query(RETENTION, 10_001)
    yield "sql.state_counts_statement (every terminal state with a RETENTION)", statement
    yield (
        "sql.QUEUE_AVAILABLE_JOBS (annotating Django's query of queues)",
        (sql.QUEUE_AVAILABLE_JOBS),
    )
    yield "sql.QUEUE_RUNNING_JOBS (annotating Django's query of queues)", sql.QUEUE_RUNNING_JOBS
    yield "sql.TASK_NAMES", sql.TASK_NAMES


def health() -> Rendered:
    yield "sql.QUEUE_LATENCY", sql.QUEUE_LATENCY


def metrics() -> Rendered:
    yield "sql.METRICS_GAUGES", sql.METRICS_GAUGES
    yield "sql.METRICS_READ_SETTINGS", sql.METRICS_READ_SETTINGS


def activity() -> Rendered:
    for name in (
        "SAMPLE_QUEUE_DEPTH",
        "FOLD_ACTIVITY_HOUR",
        "DELETE_OLD_ACTIVITY",
        "ACTIVITY_SERIES",
        "RECENT_ACTIVITY",
    ):
        yield f"sql.{name}", getattr(sql, name)


def listen() -> Rendered:
    for name in ("JOBS_CHANNEL", "SCHEDULED_CHANNEL", "CONTROL_CHANNEL", "LEADER_CHANNEL"):
        statement = psql.SQL(sql.LISTEN).format(channel=psql.Identifier(getattr(sql, name)))
        yield f"sql.LISTEN (channel sql.{name})", composed(statement)


def rendered() -> list[tuple[str, str]]:
    """(comment, statement) for every statement, in the order of sql.py's sections."""
    return [
        *listen(),
        *enqueue(),
        *worker_pass(),
        *maintenance(),
        *election(),
        *retention(),
        *queues_and_batches(),
        *workflows(),
        *inspection(),
        *health(),
        *metrics(),
        *activity(),
    ]


def render() -> str:
    entries = [f"-- {comment}\n{statement.strip(chr(10))}\n" for comment, statement in rendered()]
    return "\n".join([HEADER, *entries])


def test_docs_statements_sql_is_what_the_code_renders() -> None:
    text = render()
    if os.environ.get(WRITE):
        STATEMENTS.write_text(text)
        return
    committed = STATEMENTS.read_text() if STATEMENTS.exists() else ""
    if committed != text:
        diff = difflib.unified_diff(
            committed.splitlines(keepends=True),
            text.splitlines(keepends=True),
            "docs/statements.sql (committed)",
            "docs/statements.sql (as the code renders it now)",
        )
        pytest.fail(
            "docs/statements.sql is stale: the code sends other statements than it shows. "
            f"Rewrite it with\n    {REWRITE}\nand review the difference:\n"
            + "".join(list(diff)[:80]),
            pytrace=False,
        )


def public_names() -> list[str]:
    """The statements, templates, fragments, channels and functions that sql.py defines."""
    return [
        name
        for name, value in vars(sql).items()
        if not name.startswith("_")
        and (
            isinstance(value, str | dict)
            or (inspect.isfunction(value) and value.__module__ == sql.__name__)
        )
    ]


def test_every_public_name_of_sql_py_is_rendered() -> None:
    comments = "\n".join(comment for comment, _statement in rendered())
    named = set(re.findall(r"\bsql\.(\w+)", comments))
    assert len(public_names()) > 50
    assert [name for name in public_names() if name not in named] == [], (
        "render these in tests/test_statements.py (each variant of a function or template)"
    )


def test_every_channel_is_notified_as_it_is_listened_to() -> None:
    """The statements spell their channels out: each is the very name the listeners use."""
    statements = "\n".join(statement for _comment, statement in rendered())
    channels = {value for name, value in vars(sql).items() if name.endswith("_CHANNEL")}
    notified = set(re.findall(r"pg_notify\('(\w+)'", statements))
    assert channels == notified


def test_the_state_counts_come_in_the_order_their_parameters_are_bound() -> None:
    """inspection.state_counts_query binds a limit per state, then each terminal state's
    conditions and a limit, then the stuck jobs' limit: the statement's columns in that order."""
    statement, params = state_counts_query(RETENTION, 10_001)
    columns = re.findall(r"^\s+AS (\w+),?$", statement, flags=re.MULTILINE)
    assert columns == [
        *JobState.values,
        *(f"{state}_expired" for state in TERMINAL_STATES),
        "stuck",
    ]
    assert statement.count("%s") == len(params)


def test_the_switch_that_rewrites_the_file_is_not_reported_as_a_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WRITE, "1")
    messages = checks.check_unknown_environment_variables()
    assert [message for message in messages if WRITE in message.msg] == []


@pytest.mark.django_db
def test_a_numbered_statement_is_sent_as_postgresql_takes_it() -> None:
    statement = db.NumberedStatement.of("SELECT %(b)s::int - %(a)s::int, %(b)s::int, '100%%'")
    assert statement.text == "SELECT $1::int - $2::int, $1::int, '100%'"
    assert statement.names == ("b", "a")
    with db.connect() as connection:
        row = statement.send(connection, {"a": 1, "b": 3, "unused": 9}).fetchone()
    assert row == (2, 3, "100%")
