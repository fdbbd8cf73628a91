"""Every SQL statement the package sends, kept together; ``docs/statements.sql`` shows each one
as PostgreSQL receives it, and ``tests/test_statements.py`` fails when that file is stale.

Each statement is written out as it is sent. Where one has real variants (the claim's LIMIT and
queue filter, the insert's queue touch and unique conflict, the promotion's queue filter, the
cleaner's table and condition, the overview's expiry conditions), a function or a template
renders them from fixed fragments chosen here, never from input; identifiers (a table, an index,
a channel to LISTEN on) are composed with ``psycopg.sql.Identifier``.

Parameters are named, ``%(name)s``, with one exception: SQL that Django compiles into its own
queries takes positional ``%s``, as Django's expressions do. That is the retention conditions
(``Job.objects`` hides expired jobs by them), the statements built around them (the cleaner's
deletes, the overview's counts per state), and the queue counts that Django's queries of queues
are annotated with.

Times come from the database clock (``now()``) unless a caller injects ``now``, sent as
``COALESCE(%(now)s::timestamptz, now())``: workers on many machines disagree about time, the
database does not.

The comments say why each statement is written as it is; the measurements behind them are in
``docs/performance.md``.

Not here: the migrations (the schema's history, run once by ``migrate``) and ``embedded.py`` (a
PostgreSQL for demos and tests, which the queue never imports).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from psycopg import sql as psql

# Notifications. NOTIFY is transactional: listeners hear only committed work. Each statement
# that notifies spells its channel out; the channels are named here for the listeners.

JOBS_CHANNEL = "eddyq_jobs"  # payload: a queue name that has new available jobs
SCHEDULED_CHANNEL = "eddyq_scheduled"  # new future work: the scheduler re-reads its next wake

# {channel} is a psycopg.sql.Identifier of one of the channels of this module.
LISTEN = "LISTEN {channel}"


# Enqueue.
#
# The statements that write rows (here, and the finish, hand-back and promotion below) wake
# whoever the rows concern from a subquery evaluated once per statement over the rows written:
# the workers of the queues that got available jobs, and the scheduler if any job now waits for
# a future run_at.

# Rows of eddyq_queues for the given queues: created if missing, their updated_at touched unless
# recent. SKIP LOCKED: an enqueue never waits for another transaction's touch.
_TOUCH_QUEUES = """
, created_queues AS (
    INSERT INTO eddyq_queues (name, created_at, updated_at, metadata)
    SELECT DISTINCT queue, now(), now(), '{}'::jsonb FROM input
    ON CONFLICT (name) DO NOTHING
), touched_queues AS (
    UPDATE eddyq_queues SET updated_at = now()
    WHERE name IN (
        SELECT name FROM eddyq_queues
        WHERE name IN (SELECT queue FROM input) AND updated_at < now() - interval '5 seconds'
        FOR UPDATE SKIP LOCKED
    )
)
"""

# Jobs given as arrays, an element each: enqueue_many below COPY's threshold, and an enqueue
# with a unique key or a limit key, or whose queue row is due for a touch. {touch_queues} is
# _TOUCH_QUEUES or nothing, {on_conflict} skips the jobs whose unique key is held, or is nothing.
_INSERT_JOBS = """
WITH input AS (
    SELECT *, COALESCE(given_run_at, now() + make_interval(secs => delay)) AS due_at
    FROM unnest(
        %(tasks)s::text[], %(args)s::jsonb[], %(kwargs)s::jsonb[], %(queues)s::text[],
        %(priorities)s::smallint[], %(max_attempts)s::integer[], %(run_ats)s::timestamptz[],
        %(delays)s::float8[], %(retentions)s::jsonb[], %(metadatas)s::jsonb[],
        %(batch_ids)s::bigint[], %(unique_keys)s::text[], %(limit_keys)s::text[]
    ) WITH ORDINALITY AS input(
        task, args, kwargs, queue, priority, max_attempts, given_run_at, delay, retention,
        metadata, batch_id, unique_key, limit_key, position
    )
){touch_queues}, inserted AS (
    INSERT INTO eddyq_jobs (
        task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
        errors, retention, metadata, batch_id, unique_key, limit_key
    )
    SELECT task, args, kwargs, queue, priority,
           CASE WHEN due_at > now() THEN 'scheduled' ELSE 'available' END,
           0, max_attempts, due_at, now(), '[]'::jsonb, retention, metadata, batch_id, unique_key,
           limit_key
    FROM input
    ORDER BY position
    {on_conflict}
    RETURNING id, state, run_at, created_at, queue, unique_key
)
SELECT id, state, run_at, created_at, unique_key, (
    SELECT count(pg_notify('eddyq_jobs', queue))
           + (SELECT count(pg_notify('eddyq_scheduled', ''))
              FROM (SELECT FROM inserted WHERE state IN ('scheduled', 'retryable') LIMIT 1)
                   AS waiting)
    FROM (SELECT DISTINCT queue FROM inserted WHERE state = 'available') AS woken
)
FROM inserted
ORDER BY id
"""


def _insert_jobs_statement(*, touch_queues: bool, unique: bool) -> str:
    """The insert, creating and touching queue rows or not, skipping unique conflicts or not."""
    return _INSERT_JOBS.format(
        touch_queues=_TOUCH_QUEUES if touch_queues else "",
        on_conflict=(
            "ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING" if unique else ""
        ),
    )


# One job, when its queue row needs no touch and it has no unique key (most enqueue() calls):
# scalar parameters and no CTEs, which costs the server far less to plan than the unnest form.
# Its JSON comes as text, written by arguments.dumps, cheaper than psycopg's JSON adapter.
INSERT_ONE_JOB = """
INSERT INTO eddyq_jobs (
    task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
    errors, retention, metadata, batch_id
)
SELECT %(task)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(queue)s, %(priority)s,
       CASE WHEN due.at > now() THEN 'scheduled' ELSE 'available' END,
       0, %(max_attempts)s, due.at, now(), '[]'::jsonb, %(retention)s::jsonb,
       %(metadata)s::jsonb, %(batch_id)s
FROM (SELECT COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s))) AS due(at)
RETURNING id, state, run_at, created_at, unique_key, (
    SELECT count(*) FROM (
        SELECT CASE WHEN state = 'available' THEN pg_notify('eddyq_jobs', queue)
                    ELSE pg_notify('eddyq_scheduled', '') END
    ) AS sent
)
"""

# The unnest insert's four variants, keyed by (touch_queues, unique).
INSERT_JOBS = {
    (touch, unique): _insert_jobs_statement(touch_queues=touch, unique=unique)
    for touch in (False, True)
    for unique in (False, True)
}

# Large enqueues: ids and the transaction's now() first, then COPY, then what the INSERT's CTEs
# would have done. The sequence is named in the text: found at run time, by
# pg_get_serial_sequence or from a subquery, it made every nextval far dearer.
RESERVE_JOB_IDS = """
SELECT now(), array(
    SELECT nextval('eddyq_jobs_id_seq') FROM generate_series(1, %(count)s)
)
"""

# A job due later has its run_at in the rows.
COPY_JOBS = """
COPY eddyq_jobs (
    id, task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at,
    errors, retention, metadata, batch_id
) FROM STDIN
"""

# created_at, and run_at when it is the enqueue's own now(), are left to their column default:
# the same now() of the same transaction, without PostgreSQL parsing two timestamps a row, a
# good part of what a row costs to COPY.
COPY_JOBS_RUN_AT_NOW = """
COPY eddyq_jobs (
    id, task, args, kwargs, queue, priority, state, attempt, max_attempts,
    errors, retention, metadata, batch_id
) FROM STDIN
"""

# After a COPY, the queue row as the insert's touch would have made it.
CREATE_AND_TOUCH_QUEUES = """
WITH input AS (
    SELECT unnest(%(queues)s::text[]) AS queue
), created_queues AS (
    INSERT INTO eddyq_queues (name, created_at, updated_at, metadata)
    SELECT DISTINCT queue, now(), now(), '{}'::jsonb FROM input
    ON CONFLICT (name) DO NOTHING
), touched_queues AS (
    UPDATE eddyq_queues SET updated_at = now()
    WHERE name IN (
        SELECT name FROM eddyq_queues
        WHERE name IN (SELECT queue FROM input) AND updated_at < now() - interval '5 seconds'
        FOR UPDATE SKIP LOCKED
    )
)
SELECT 1
"""

# After a COPY, the wake-up the insert would have sent.
NOTIFY_NEW_JOBS = """
SELECT count(pg_notify('eddyq_jobs', queue)) FROM unnest(%(available_queues)s::text[]) AS queue
UNION ALL
SELECT count(pg_notify('eddyq_scheduled', '')) WHERE %(scheduled)s
"""

# Before a unique insert: failed and cancelled jobs, and completed ones older than the
# window, stop holding their key.
RELEASE_UNIQUE_KEYS = """
UPDATE eddyq_jobs AS job SET unique_key = NULL
FROM unnest(%(unique_keys)s::text[], %(windows)s::float8[]) AS held(unique_key, window_seconds)
WHERE job.unique_key = held.unique_key
  AND (job.state IN ('failed', 'cancelled')
       OR (job.state = 'completed'
           AND (held.window_seconds IS NULL
                OR job.finalized_at <= now() - make_interval(secs => held.window_seconds))))
"""


# Claim, finish, heartbeat: a worker's pass.

# The activity counters (eddyq_activity) of the jobs a statement finished (its CTE's rows of
# (state, queue), grouped by queue): how many ended in each state, and how they add to the row
# of the minute already there.
_ACTIVITY_COUNTS = """count(*) FILTER (WHERE state = 'completed'),
           count(*) FILTER (WHERE state = 'failed'),
           count(*) FILTER (WHERE state = 'retryable'),
           count(*) FILTER (WHERE state = 'cancelled'),
           count(*) FILTER (WHERE state = 'scheduled')"""
_ADD_ACTIVITY_COUNTS = """completed = activity.completed + EXCLUDED.completed,
        failed = activity.failed + EXCLUDED.failed,
        retried = activity.retried + EXCLUDED.retried,
        cancelled = activity.cancelled + EXCLUDED.cancelled,
        snoozed = activity.snoozed + EXCLUDED.snoozed"""

# The queues of the jobs a worker claimed, touched now and then so that the queue cleaner keeps
# their rows.
TOUCH_QUEUES = """
UPDATE eddyq_queues SET updated_at = now()
WHERE name IN (
    SELECT name FROM eddyq_queues
    WHERE name = ANY(%(queues)s::text[]) AND updated_at < now() - interval '5 seconds'
    FOR UPDATE SKIP LOCKED
)
"""

# The queues a plain claim leaves alone: the paused ones, and the limited ones, whose jobs only
# the limited claim takes. A limit is seen here, by every worker, as soon as it is committed.
_HELD_BACK_QUEUES = """SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL"""

# What a claim writes on each job it takes, in both claims. The attempt is capped so that a row
# written with the largest integer runs (and fails) once more, instead of making every claim
# that meets it fail.
_CLAIMED_JOB = """state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)"""


# Paused (and limited) queues are left out by NOT IN, which stays a filter on a hash of their
# names, applied to the claim index's ordered scan: the first jobs found are the ones taken.
# (NOT EXISTS becomes an anti-join, which the planner expects to leave almost no jobs once it
# knows eddyq_queues holds every queue; it then read and sorted every available job at each
# claim, far slower with a backlog waiting. queue <> ALL(ARRAY(...)) did the same.)
# The names are a primary key, never NULL, so NOT IN means what it says.
# The jobs picked are updated by primary key, written as id = ANY(ARRAY(...)): joined to the
# picked ids instead, a table of a few thousand rows was planned as a hash join over a scan of
# every row at every pass, the dead rows a drain leaves behind included.
_CLAIM = """
WITH picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL {queue_filter}
      AND queue NOT IN ({held_back_queues})
    ORDER BY priority DESC, run_at, id
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
)
UPDATE eddyq_jobs AS job
SET {claimed_job}
WHERE job.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING job.id, job.task, job.args, job.kwargs, job.queue, job.priority,
          extract(epoch FROM job.run_at)::float8, job.attempt, job.max_attempts, job.batch_id,
          job.metadata, extract(epoch FROM job.created_at)::float8
"""


def _queue_filter(queues: Sequence[str] | None) -> str:
    if queues is None:
        return ""
    if len(queues) == 1:
        return "AND queue = (%(queues)s::text[])[1]"
    return "AND queue = ANY(%(queues)s::text[])"


def claim_statement(limit: int, queues: Sequence[str] | None) -> str:
    """The claim of up to ``limit`` jobs from ``queues`` (sent as ``%(queues)s``), or from any
    queue when ``queues`` is None.

    The LIMIT is part of the text, not a parameter: for a parameter the planner assumes a tenth
    of the table, so the generic plan of a prepared claim always looked dearer than a custom one
    and the claim was planned anew at every pass, which took as long as running it. Each
    limit is then a statement of its own, planned once. One queue is an equality, which the
    queue index answers in claim order.
    """
    return _CLAIM.format(
        queue_filter=_queue_filter(queues),
        held_back_queues=_HELD_BACK_QUEUES,
        claimed_job=_CLAIMED_JOB,
        limit=int(limit),
    )


# Flow control (limits.py, docs/flow-control.md). The limits a queue's row holds are enforced by
# the limited claim, which a worker sends, after LOCK_LIMITS, while any of its queues has one.

# The queues with a limit, which a worker reads now and then to know whether to send the
# limited claim; the plain claim leaves them alone whatever the worker knows.
LIMITED_QUEUES = """
SELECT name FROM eddyq_queues WHERE concurrency IS NOT NULL OR rate_limit IS NOT NULL
"""

# One claim at a time per limited queue, on every worker: a transaction-scoped advisory lock per
# queue (never a row lock, which an enqueue's touch of the queue's row may hold for as long as
# its transaction lasts), taken in name order so that two claims never deadlock. Sent before
# the limited claim, in the same transaction, so that the claim's snapshot, taken after the
# locks, sees every claim committed before it.
# 1701078137 is "eddy" in ASCII: the space of flow control's advisory locks.
LOCK_LIMITS = """
SELECT count(pg_advisory_xact_lock(1701078137, hashtext(name)))
FROM (SELECT DISTINCT unnest(%(limited)s::text[]) AS name ORDER BY name) AS limited
"""

# Claims up to %(limit)s jobs: first from the limited queues (%(limited)s), as many as each allows
# (its concurrency less its running jobs, the whole tokens left in its rate's bucket), then from
# the other queues the plain claim would take from, up to %(limit)s in all ({other_picked}: left
# out while a worker knows they have nothing, see PassRunner). A rate's bucket is
# refilled by the time elapsed since the last claim took from it, counted by the clock at the
# claim (clock_timestamp(), after the locks: transaction times may run backwards between two
# claims), and written back less the jobs taken. The jobs picked are looked up by id in an
# array: joined to the picks, whose LIMIT is an expression, the update read the whole table.
_LIMITED_CLAIM = """
WITH RECURSIVE clock AS MATERIALIZED (
    SELECT clock_timestamp() AS at
), allowance AS MATERIALIZED (
    SELECT queue.name, refill.tokens, queue.rate_limit, queue.rate_period, queue.rate_burst,
           GREATEST(
               LEAST(
                   %(limit)s,
                   queue.concurrency - (
                       SELECT count(*) FROM eddyq_jobs AS job
                       WHERE job.state = 'running' AND job.queue = queue.name
                   ),
                   floor(refill.tokens)
               ),
               0
           )::integer AS allowed
    FROM eddyq_queues AS queue
    CROSS JOIN clock
    LEFT JOIN eddyq_rate_buckets AS bucket ON bucket.name = queue.name
    CROSS JOIN LATERAL (
        SELECT LEAST(
                   queue.rate_burst::float8,
                   COALESCE(bucket.tokens, queue.rate_burst)
                   + queue.rate_limit / queue.rate_period
                     * GREATEST(extract(epoch FROM clock.at - bucket.refilled_at), 0)
               ) AS tokens
    ) AS refill
    WHERE queue.name = ANY(%(limited)s::text[])
      AND queue.paused_at IS NULL
      AND (queue.concurrency IS NOT NULL OR queue.rate_limit IS NOT NULL)
), limited AS (
    SELECT job.id, job.priority, job.run_at
    FROM allowance
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NULL AND queue = allowance.name
        ORDER BY priority DESC, run_at, id
        LIMIT allowance.allowed
        FOR UPDATE SKIP LOCKED
    ) AS job
), limited_picked AS (
    SELECT id FROM limited ORDER BY priority DESC, run_at, id LIMIT %(limit)s
){keyed_picked}, other_picked AS (
    {other_picked}
), claimed AS (
    UPDATE eddyq_jobs AS job
    SET {claimed_job}
    WHERE job.id = ANY(ARRAY(
        SELECT id FROM limited_picked
        UNION ALL SELECT id FROM keyed_picked
        UNION ALL SELECT id FROM other_picked
    ))
    RETURNING job.id, job.task, job.args, job.kwargs, job.queue, job.priority,
              extract(epoch FROM job.run_at)::float8 AS due, job.attempt, job.max_attempts,
              job.batch_id, job.metadata, extract(epoch FROM job.created_at)::float8 AS created,
              job.limit_key
), spent AS (
    INSERT INTO eddyq_rate_buckets AS bucket (name, tokens, refilled_at, full_at)
    SELECT allowance.name, allowance.tokens - taken.jobs, clock.at,
           {full_at}
    FROM allowance
    CROSS JOIN clock
    JOIN (SELECT queue, count(*) AS jobs FROM claimed WHERE limit_key IS NULL GROUP BY queue)
      AS taken ON taken.queue = allowance.name
    WHERE allowance.tokens IS NOT NULL
    ON CONFLICT (name) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, full_at = EXCLUDED.full_at
){key_spent}
SELECT id, task, args, kwargs, queue, priority, due, attempt, max_attempts, batch_id, metadata,
       created
FROM claimed
"""


_OTHER_PICKED = """SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL {queue_filter}
      AND queue NOT IN ({held_back_queues})
    ORDER BY priority DESC, run_at, id
    LIMIT GREATEST(
        %(limit)s - (SELECT count(*) FROM limited_picked) - (SELECT count(*) FROM keyed_picked), 0
    )
    FOR UPDATE SKIP LOCKED"""
_NO_OTHER_PICKED = "SELECT NULL::bigint AS id WHERE false"

# When a bucket a claim took from is full again: the tokens it lacks, at its rate.
_BUCKET_FULL_AT = """clock.at + make_interval(
               secs => (allowance.rate_burst - (allowance.tokens - taken.jobs))
                        * allowance.rate_period / allowance.rate_limit
           )"""

# The jobs of tasks limited per key (docs/flow-control.md). Each such task's limits come as
# parallel arrays, from the worker's registry (the code, not a row, declares them). A key has
# room for its concurrency less its running jobs (in any queue), and for its bucket's whole
# tokens. Every claim of a key's jobs, and every write of its bucket, is made under the key's
# advisory lock, taken by LOCK_KEYS in the claim's transaction before the claim: the claim's
# snapshot, taken after the lock, sees every claim of the key committed before. Keys are
# locked with pg_try_advisory_xact_lock, so that workers claim different keys side by side and
# none ever waits for another.
#
# LOCK_KEYS chooses the keys: those with room whose next jobs come first in claim order, up to
# %(limit)s of them, locked in that order, skipping a key another worker holds, and a key whose
# next job was claimed since the statement's snapshot (the lock on the job's row reads it as it
# is now: otherwise a claim that followed another closely took the keys it had just filled, and
# found them without room). It leaves them in the transaction's setting eddyq.claim_keys for
# the claim. It finds the keys' jobs first in a window, the first keyed jobs in claim order
# (eddyq_jobs_keyed_order_idx), four times the claim's limit and at least 32, which serves when
# most keys have room. When the window is full and has fewer than %(limit)s jobs with room (a
# key's backlog held back by its limit fills it), the keys are walked ({key_heads}), one index
# probe each along eddyq_jobs_keyed_claim_idx, whose first entry past a (queue, task, key) is
# the next one's next job: however long a key's backlog, the jobs of other keys behind it are
# found in the same claim.
_KEY_CANDIDATES = """
WITH RECURSIVE clock AS MATERIALIZED (
    SELECT clock_timestamp() AS at
), task_limit AS MATERIALIZED (
    {task_limit}
), key_running AS MATERIALIZED (
    {key_running}
), key_window AS MATERIALIZED (
    SELECT queue, task, limit_key, id, priority, run_at,
           row_number() OVER (
               PARTITION BY task, limit_key ORDER BY priority DESC, run_at, id
           ) AS nth
    FROM (
        SELECT queue, task, limit_key, id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL {queue_filter}
          AND queue NOT IN ({paused_queues})
        ORDER BY priority DESC, run_at, id
        LIMIT GREATEST(4 * %(limit)s, 32)
    ) AS job
    WHERE task IN (SELECT task FROM task_limit)
), window_room AS MATERIALIZED (
    {window_room}
), window_offer AS MATERIALIZED (
    SELECT job.id
    FROM key_window AS job
    JOIN window_room AS room ON room.task = job.task AND room.limit_key = job.limit_key
    WHERE job.nth <= room.allowed
), {key_heads}, walked AS MATERIALIZED (
    SELECT DISTINCT ON (head.task, head.limit_key) head.*
    FROM key_heads AS head
    WHERE head.task IN (SELECT task FROM task_limit)
      AND head.queue NOT IN ({paused_queues})
      AND (head.task, head.limit_key) NOT IN (SELECT task, limit_key FROM key_window)
    ORDER BY head.task, head.limit_key, head.priority DESC, head.run_at, head.id
), walked_room AS MATERIALIZED (
    {walked_room}
), candidate AS MATERIALIZED (
    SELECT queue, task, limit_key, id FROM (
        SELECT queue, task, limit_key, priority, run_at, id FROM window_room WHERE allowed >= 1
        UNION ALL
        SELECT queue, task, limit_key, priority, run_at, id FROM walked_room WHERE allowed >= 1
    ) AS offer
    ORDER BY priority DESC, run_at, id
)
SELECT set_config('eddyq.claim_keys', COALESCE(jsonb_agg(locked)::text, '[]'), true)
FROM (
    SELECT candidate.queue, candidate.task, candidate.limit_key
    FROM candidate
    CROSS JOIN LATERAL (
        SELECT FROM eddyq_jobs AS job
        WHERE job.id = candidate.id AND job.state = 'available'
          AND pg_try_advisory_xact_lock(
              1701078137, hashtext('task:' || candidate.task || ':' || candidate.limit_key)
          )
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS still_available
    LIMIT %(limit)s
) AS locked
"""
_TASK_LIMIT = """SELECT * FROM unnest(
        %(keyed_tasks)s::text[], %(key_concurrency)s::integer[], %(key_rate)s::integer[],
        %(key_period)s::float8[], %(key_burst)s::integer[]
    ) AS task_limit(task, concurrency, rate_limit, rate_period, rate_burst)"""
_KEY_RUNNING = """SELECT task, limit_key, count(*) AS jobs FROM eddyq_jobs
    WHERE state = 'running' AND limit_key IS NOT NULL AND task = ANY(%(keyed_tasks)s::text[])
    GROUP BY task, limit_key"""
# The keys LOCK_KEYS locked, as much of their room as the claim takes, seen after their locks.
_KEYED_PICKED = """
, task_limit AS MATERIALIZED (
    {task_limit}
), key_running AS MATERIALIZED (
    {key_running}
), key_room AS MATERIALIZED (
    {key_room}
), keyed AS (
    SELECT job.id, job.priority, job.run_at
    FROM key_room
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL AND queue = key_room.queue
              AND task = key_room.task AND limit_key = key_room.limit_key
              AND queue NOT IN ({paused_queues})
        ORDER BY priority DESC, run_at, id
        LIMIT key_room.allowed
        FOR UPDATE SKIP LOCKED
    ) AS job
    WHERE key_room.allowed >= 1
), keyed_picked AS (
    SELECT id FROM keyed ORDER BY priority DESC, run_at, id
    LIMIT GREATEST(%(limit)s - (SELECT count(*) FROM limited_picked), 0)
)"""
_LOCKED_KEYS = """(
        SELECT locked.*, NULL::bigint AS id, NULL::smallint AS priority,
               NULL::timestamptz AS run_at
        FROM jsonb_to_recordset(COALESCE(current_setting('eddyq.claim_keys', true), '[]')::jsonb)
             AS locked(queue text, task text, limit_key text)
    )"""
_KEY_ROOM = """SELECT head.queue, head.task, head.limit_key, head.id, head.priority, head.run_at,
           'task:' || head.task || ':' || head.limit_key AS name, refill.tokens,
           task_limit.rate_limit, task_limit.rate_period, task_limit.rate_burst,
           LEAST(
               %(limit)s,
               COALESCE(task_limit.concurrency - COALESCE(running.jobs, 0), %(limit)s),
               COALESCE(floor(refill.tokens), %(limit)s)
           )::integer AS allowed
    FROM {source} AS head
    JOIN task_limit ON task_limit.task = head.task
    CROSS JOIN clock
    LEFT JOIN key_running AS running
      ON running.task = head.task AND running.limit_key = head.limit_key
    LEFT JOIN eddyq_rate_buckets AS bucket
      ON task_limit.rate_limit IS NOT NULL
     AND bucket.name = 'task:' || head.task || ':' || head.limit_key
    CROSS JOIN LATERAL (
        SELECT CASE WHEN task_limit.rate_limit IS NOT NULL THEN LEAST(
                   task_limit.rate_burst::float8,
                   COALESCE(bucket.tokens, task_limit.rate_burst)
                   + task_limit.rate_limit / task_limit.rate_period
                     * GREATEST(extract(epoch FROM clock.at - bucket.refilled_at), 0)
               ) END AS tokens
    ) AS refill"""
_NO_KEYED_PICKED = """
, keyed_picked AS (
    SELECT NULL::bigint AS id WHERE false
)"""
_KEY_SPENT = """, key_spent AS (
    INSERT INTO eddyq_rate_buckets AS bucket (name, tokens, refilled_at, full_at)
    SELECT allowance.name, allowance.tokens - taken.jobs, clock.at,
           {full_at}
    FROM key_room AS allowance
    CROSS JOIN clock
    JOIN (
        SELECT task, limit_key, count(*) AS jobs FROM claimed
        WHERE limit_key IS NOT NULL GROUP BY task, limit_key
    ) AS taken ON taken.task = allowance.task AND taken.limit_key = allowance.limit_key
    WHERE allowance.tokens IS NOT NULL
    ON CONFLICT (name) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, full_at = EXCLUDED.full_at
)"""
# Whether the keys are walked: the window is full, and offers fewer jobs than the claim takes.
_WALK_KEYS = """(SELECT count(*) FROM key_window) >= GREATEST(4 * %(limit)s, 32)
          AND (SELECT count(*) FROM window_offer) < %(limit)s"""
# The first job of each (queue, task, key) with available jobs, of any queue.
_KEY_HEADS_ANY_QUEUE = """key_heads AS (
    SELECT first.* FROM (
        SELECT queue, task, limit_key, id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL
        ORDER BY queue, task, limit_key, priority DESC, run_at, id
        LIMIT 1
    ) AS first
    WHERE {walk_keys}
    UNION ALL
    SELECT next.* FROM key_heads AS previous
    CROSS JOIN LATERAL (
        SELECT queue, task, limit_key, id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL
          AND (queue, task, limit_key) > (previous.queue, previous.task, previous.limit_key)
        ORDER BY queue, task, limit_key, priority DESC, run_at, id
        LIMIT 1
    ) AS next
)"""
# The same, of the worker's queues (%(queues)s): a walk of each, never reading another's jobs.
_KEY_HEADS_FROM_QUEUES = """key_heads AS (
    SELECT first.* FROM unnest(%(queues)s::text[]) AS served(queue)
    CROSS JOIN LATERAL (
        SELECT queue, task, limit_key, id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL AND queue = served.queue
        ORDER BY queue, task, limit_key, priority DESC, run_at, id
        LIMIT 1
    ) AS first
    WHERE {walk_keys}
    UNION ALL
    SELECT next.* FROM key_heads AS previous
    CROSS JOIN LATERAL (
        SELECT queue, task, limit_key, id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL AND queue = previous.queue
          AND (task, limit_key) > (previous.task, previous.limit_key)
        ORDER BY queue, task, limit_key, priority DESC, run_at, id
        LIMIT 1
    ) AS next
)"""
_PAUSED_QUEUES = "SELECT name FROM eddyq_queues WHERE paused_at IS NOT NULL"


# Before the limited claim (and LOCK_KEYS), in their transaction: their plans are reused once
# they are prepared, instead of planned again at each pass, which took longer than running them.
LIMITED_CLAIM_GENERIC_PLANS = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"


def lock_keys_statement(queues: Sequence[str] | None) -> str:
    """Locks up to ``%(limit)s`` keys with room of the tasks limited per key (sent as
    ``%(keyed_tasks)s`` and the like), of ``queues`` or of any queue, for the keyed claim that
    follows in the transaction (``limited_claim_statement(..., keyed=True)``)."""
    return _KEY_CANDIDATES.format(
        task_limit=_TASK_LIMIT,
        key_running=_KEY_RUNNING,
        window_room=_KEY_ROOM.format(source="(SELECT * FROM key_window WHERE nth = 1)"),
        walked_room=_KEY_ROOM.format(source="walked"),
        key_heads=(_KEY_HEADS_ANY_QUEUE if queues is None else _KEY_HEADS_FROM_QUEUES).format(
            walk_keys=_WALK_KEYS
        ),
        queue_filter=_queue_filter(queues),
        paused_queues=_PAUSED_QUEUES,
    )


def limited_claim_statement(
    queues: Sequence[str] | None, *, others: bool = True, keyed: bool = False
) -> str:
    """The claim of up to ``%(limit)s`` jobs when some of the worker's queues are limited (sent
    as ``%(limited)s``, after ``LOCK_LIMITS``), or some of its tasks are limited per key
    (``keyed``, their limits sent as ``%(keyed_tasks)s`` and the like, after
    ``lock_keys_statement``): see ``claim_statement`` for the rest. Without ``others``, from the
    limited queues and keys only.

    Unlike the plain claim's, the limit is a parameter: these statements are run with generic
    plans (``LIMITED_CLAIM_GENERIC_PLANS``), one per worker and variant, rather than planned
    for each limit a worker asks for, which took longer than running them."""
    other_picked = (
        _OTHER_PICKED.format(queue_filter=_queue_filter(queues), held_back_queues=_HELD_BACK_QUEUES)
        if others
        else _NO_OTHER_PICKED
    )
    keyed_picked = (
        _KEYED_PICKED.format(
            task_limit=_TASK_LIMIT,
            key_running=_KEY_RUNNING,
            key_room=_KEY_ROOM.format(source=_LOCKED_KEYS),
            paused_queues=_PAUSED_QUEUES,
        )
        if keyed
        else _NO_KEYED_PICKED
    )
    return _LIMITED_CLAIM.format(
        keyed_picked=keyed_picked,
        other_picked=other_picked,
        key_spent=_KEY_SPENT.format(full_at=_BUCKET_FULL_AT) if keyed else "",
        full_at=_BUCKET_FULL_AT,
        claimed_job=_CLAIMED_JOB,
    )


# Sent before a claim from any queue, in its transaction, so that the claim is planned as it
# should always run: the ordered scan of the claim index, stopped at the LIMIT. With no
# statistics (a new table, or one truncated or restored, until autovacuum's first ANALYZE) the
# planner expected a few dozen available jobs and chose to read every one and sort them, which
# with a large backlog made each claim far slower. A claim from one queue needs no such help
# (its equality is answered in order by the queue index, statistics or not); a claim from
# several keeps the planner's choice: the queue index, the one that finds a rare queue's jobs
# without reading the others', gives them in order only one queue at a time.
# set_config(..., true) rather than SET LOCAL, which outside BEGIN (a pipeline's statements are
# outside it) logs a WARNING on the server at every pass.
CLAIM_WITHOUT_SORT = "SELECT set_config('enable_sort', 'off', true)"
# The same for the limited claim, which sorts the few jobs its limited queues gave: the cost
# that sort is then charged would have PostgreSQL compile the statement (JIT) at every pass,
# far slower than running it.
LIMITED_CLAIM_WITHOUT_SORT = (
    "SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)"
)


# The finish and the heartbeat test a job's state as (state = 'running') IS TRUE: written
# plainly, the test lets the planner read eddyq_jobs_lease_idx whenever its statistics say few
# jobs run (in a queue table they are often stale), and walk every running job of every worker
# (and the dead entries of recent claims) instead of looking the given ids up by primary key,
# far slower with thousands of jobs running. The ids are also given as id = ANY(ARRAY(...)), so
# that the jobs are looked up by primary key whatever the table's size: on a table of a few
# thousand rows the join alone was planned as a scan of every row, each compared with every
# outcome.

# Ends attempts, one statement per batch of finished jobs. Fenced: only a job still running
# under this worker and this attempt changes, so a late finish never overwrites a rescue.
# The outcomes come as one JSON array of objects (keys left out are null): one parameter that one
# json.dumps writes, where seven arrays took psycopg's array adapters much of a pass's Python.
# The jobs it finished are added to the worker's own activity row of the minute (counted), in
# the same statement: the charts read the counts, never the finished jobs, and the pass sends
# no statement more. A job handed back (available again) has no outcome to count.
# It wakes the workers of the queues that got available jobs, and of the queues with a
# concurrency limit, or jobs with a limit key, whose jobs ended: a slot of theirs is free, which
# another worker may be waiting for.
_FINISH = f"""
WITH outcome AS (
    SELECT * FROM jsonb_to_recordset(%(outcomes)s::jsonb) AS outcome(
        id bigint, attempt integer, state text, result jsonb, error jsonb, delay float8,
        attempt_given_back integer
    )
), finished AS (
    UPDATE eddyq_jobs AS job
    SET state = outcome.state,
        attempt = job.attempt - COALESCE(outcome.attempt_given_back, 0),
        result = outcome.result,
        errors = CASE WHEN outcome.error IS NULL THEN job.errors
                      ELSE job.errors || jsonb_build_array(
                          outcome.error
                          || jsonb_build_object('at', now(), 'worker', %(worker_id)s::text))
                 END,
        run_at = CASE WHEN outcome.delay IS NULL THEN job.run_at
                      ELSE now() + make_interval(secs => outcome.delay)
                 END,
        finalized_at = CASE WHEN outcome.state IN ('completed', 'failed', 'cancelled')
                            THEN now() END,
        locked_by = NULL,
        locked_until = NULL
    FROM outcome
    WHERE job.id = ANY(ARRAY(SELECT id FROM outcome))
      AND job.id = outcome.id
      AND (job.state = 'running') IS TRUE
      AND job.locked_by = %(worker_id)s
      AND job.attempt = outcome.attempt{{fence}}
    RETURNING job.id, job.state, job.queue, job.limit_key
), counted AS (
    INSERT INTO eddyq_activity AS activity (
        minute, queue, source, completed, failed, retried, cancelled, snoozed
    )
    SELECT date_trunc('minute', now(), 'UTC'), queue, {{source}}, {_ACTIVITY_COUNTS}
    FROM finished
    WHERE state <> 'available'
    GROUP BY queue
    ON CONFLICT (minute, queue, source) DO UPDATE
    SET {_ADD_ACTIVITY_COUNTS}
)
SELECT id, state, (
    SELECT count(pg_notify('eddyq_jobs', queue))
           + (SELECT count(pg_notify('eddyq_scheduled', ''))
              FROM (SELECT FROM finished WHERE state IN ('scheduled', 'retryable') LIMIT 1)
                   AS waiting)
    FROM (
        SELECT DISTINCT queue FROM finished
        WHERE state = 'available'
           OR limit_key IS NOT NULL
           OR queue IN (SELECT name FROM eddyq_queues WHERE concurrency IS NOT NULL)
    ) AS woken
) FROM finished
"""
FINISH_JOBS = _FINISH.format(fence="", source="%(worker_id)s")

# An atomic job's completion, in its handler's transaction (``worker/execution.py``): the same
# write, fenced also by a cancel, which rolls back what the handler wrote. It is counted into its
# handler thread's own activity row (``source``): a row of the worker's, which its passes lock
# until they commit, would have the two transactions wait on each other.
FINISH_ATOMIC_JOB = _FINISH.format(
    fence="\n      AND job.cancel_requested_at IS NULL", source="%(source)s"
)

# The worker registry. A worker registers as it starts and says it is alive with each heartbeat,
# in the same pass: one upsert, so that a worker whose row the cleaner deleted (unseen for long)
# registers again. Times by the database's clock.
WORKER_SEEN = """
INSERT INTO eddyq_workers AS worker (
    id, host, pid, version, queues, concurrency, started_at, last_seen_at, running, leader,
    stopped_at
)
VALUES (
    %(id)s, %(host)s, %(pid)s, %(version)s, %(queues)s::jsonb, %(concurrency)s, now(), now(),
    %(running)s, %(leader)s, NULL
)
ON CONFLICT (id) DO UPDATE
SET last_seen_at = now(), running = EXCLUDED.running, leader = EXCLUDED.leader
"""

WORKER_STOPPED = """
UPDATE eddyq_workers
SET stopped_at = now(), last_seen_at = now(), running = 0, leader = false
WHERE id = %(id)s
"""

# One statement renews the lease of every job this worker runs; jobs not returned are no
# longer this worker's (rescued or finished elsewhere), and it learns which were cancelled.
HEARTBEAT = """
UPDATE eddyq_jobs
SET heartbeat_at = now(), locked_until = now() + make_interval(secs => %(lease_seconds)s)
WHERE id = ANY(%(ids)s::bigint[]) AND (state = 'running') IS TRUE AND locked_by = %(worker_id)s
RETURNING id, cancel_requested_at IS NOT NULL
"""

# After a reply was lost (a connection that broke as a pass committed, a pass whose results
# could not be read): the jobs running under this worker that it does not know of go back, their
# attempt given back, since no handler ever started them; one whose cancellation was asked for
# ends cancelled instead. The lease index holds just the running jobs.
HAND_BACK_STRAYS = """
WITH handed_back AS (
    UPDATE eddyq_jobs AS job
    SET state = CASE WHEN job.cancel_requested_at IS NULL THEN 'available' ELSE 'cancelled' END,
        attempt = GREATEST(job.attempt - 1, 0),
        finalized_at = CASE WHEN job.cancel_requested_at IS NULL THEN NULL ELSE now() END,
        locked_by = NULL,
        locked_until = NULL
    WHERE job.state = 'running'
      AND job.locked_by = %(worker_id)s
      AND job.id <> ALL(%(known)s::bigint[])
    RETURNING job.id, job.state, job.queue, job.batch_id
)
SELECT id, state, batch_id, (
    SELECT count(pg_notify('eddyq_jobs', queue))
           + (SELECT count(pg_notify('eddyq_scheduled', ''))
              FROM (SELECT FROM handed_back WHERE state IN ('scheduled', 'retryable') LIMIT 1)
                   AS waiting)
    FROM (SELECT DISTINCT queue FROM handed_back WHERE state = 'available') AS woken
) FROM handed_back
"""

# Scheduled and retryable jobs whose time has come, made available: by the scheduler, from any
# queue, and by a burst worker, from the queues it claims from or any.
_PROMOTE_DUE = """
WITH due AS (
    SELECT id FROM eddyq_jobs
    WHERE state IN ('scheduled', 'retryable')
      AND run_at <= COALESCE(%(now)s::timestamptz, now()){queue_filter}
    ORDER BY run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE eddyq_jobs AS job SET state = 'available'
    WHERE job.id = ANY(ARRAY(SELECT id FROM due))
    RETURNING job.queue, job.state
)
SELECT count(*), (
    SELECT count(pg_notify('eddyq_jobs', queue))
           + (SELECT count(pg_notify('eddyq_scheduled', ''))
              FROM (SELECT FROM promoted WHERE state IN ('scheduled', 'retryable') LIMIT 1)
                   AS waiting)
    FROM (SELECT DISTINCT queue FROM promoted WHERE state = 'available') AS woken
) FROM promoted
"""
PROMOTE_DUE_ANY_QUEUE = _PROMOTE_DUE.format(queue_filter="")
PROMOTE_DUE_FROM_QUEUES = _PROMOTE_DUE.format(queue_filter=" AND queue = ANY(%(queues)s::text[])")


# Maintenance: rescuer, scheduler, periodic enqueuer.

# Running jobs whose lease has passed: the lease decides, never the job's age.
# The lease's end is read as text, for the error entry: a row may hold a time that no Python
# datetime can (-infinity).
SELECT_STUCK_JOBS = """
SELECT id, task, attempt, max_attempts, locked_by, locked_until::text,
       cancel_requested_at IS NOT NULL
FROM eddyq_jobs
WHERE state = 'running' AND locked_until < COALESCE(%(now)s::timestamptz, now())
ORDER BY locked_until
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# Tests the lease again, as the row is now: a heartbeat may have renewed it since it was found.
# What it rescued is counted as FINISH_JOBS counts, into a row of the rescuer's.
RESCUE_JOBS = f"""
WITH rescue AS (
    SELECT * FROM unnest(
        %(ids)s::bigint[], %(states)s::text[], %(delays)s::float8[], %(errors)s::jsonb[]
    ) AS rescue(id, state, delay, error)
), rescued AS (
    UPDATE eddyq_jobs AS job
    SET state = rescue.state,
        errors = job.errors || jsonb_build_array(
            rescue.error || jsonb_build_object('at', COALESCE(%(now)s::timestamptz, now()))),
        run_at = CASE WHEN rescue.delay IS NULL THEN job.run_at
                      ELSE COALESCE(%(now)s::timestamptz, now())
                           + make_interval(secs => rescue.delay)
                 END,
        finalized_at = CASE WHEN rescue.state IN ('failed', 'cancelled')
                            THEN COALESCE(%(now)s::timestamptz, now()) END,
        locked_by = NULL,
        locked_until = NULL
    FROM rescue
    WHERE job.id = rescue.id
      AND job.state = 'running'
      AND job.locked_until < COALESCE(%(now)s::timestamptz, now())
    RETURNING job.id, job.state, job.batch_id, job.queue
), counted AS (
    INSERT INTO eddyq_activity AS activity (
        minute, queue, source, completed, failed, retried, cancelled, snoozed
    )
    SELECT date_trunc('minute', COALESCE(%(now)s::timestamptz, now()), 'UTC'), queue,
           'rescuer', {_ACTIVITY_COUNTS}
    FROM rescued
    GROUP BY queue
    ON CONFLICT (minute, queue, source) DO UPDATE
    SET {_ADD_ACTIVITY_COUNTS}
)
SELECT id, state, batch_id FROM rescued
"""

# A job the rescuer cannot rescue (the statement above failed for it alone) is failed with its
# error entry, touching no column whose value could be what failed.
SET_ASIDE_STUCK_JOB = """
UPDATE eddyq_jobs
SET state = 'failed',
    errors = errors || jsonb_build_array(
        %(error)s::jsonb || jsonb_build_object('at', COALESCE(%(now)s::timestamptz, now()))),
    finalized_at = COALESCE(%(now)s::timestamptz, now()),
    locked_by = NULL,
    locked_until = NULL
WHERE id = %(id)s AND state = 'running' AND locked_until < COALESCE(%(now)s::timestamptz, now())
RETURNING batch_id
"""

# When the next scheduled or retryable job comes due, in seconds from now (negative: overdue). A
# job due at infinity never is (and PostgreSQL before 17 cannot subtract it); one due at
# -infinity is promoted by the pass before.
NEXT_DUE_IN = """
SELECT extract(epoch FROM min(run_at) - COALESCE(%(now)s::timestamptz, now()))
FROM eddyq_jobs
WHERE state IN ('scheduled', 'retryable') AND run_at < 'infinity'
"""

DATABASE_NOW = "SELECT now()"

# A schedule's row, locked until the transaction that may enqueue its next run ends: two
# leaders (say, across a failover) queue up here, and the second sees the first's run; an
# operator's disable committed meanwhile is seen too. Whether the run is done is compared here,
# never read: a last_run_at of ±infinity (a row edited by hand) is no datetime in Python.
LOCK_PERIODIC_SCHEDULE = """
SELECT last_run_at >= %(run_at)s, enabled FROM eddyq_periodic WHERE name = %(name)s FOR UPDATE
"""

START_PERIODIC_SCHEDULE = """
INSERT INTO eddyq_periodic (name, last_run_at, updated_at)
VALUES (%(name)s, %(run_at)s, now())
ON CONFLICT (name) DO NOTHING
"""

# Only forwards: a run is never enqueued twice, nor an older one after a newer. In the
# transaction that inserted the run's job, whose id it keeps.
ADVANCE_PERIODIC_SCHEDULE = """
UPDATE eddyq_periodic SET last_run_at = %(run_at)s, last_job_id = %(job_id)s, updated_at = now()
WHERE name = %(name)s AND last_run_at < %(run_at)s
"""

# Which schedules a pass need not lock: done already, or disabled. An infinite last_run_at
# reads as NULL, and the lock decides.
SELECT_PERIODIC_SCHEDULES = """
SELECT name, CASE WHEN isfinite(last_run_at) THEN last_run_at END, enabled FROM eddyq_periodic
"""

# A day's grace: during a deploy, workers with old and new schedules take turns leading.
FORGET_PERIODIC_SCHEDULES = """
DELETE FROM eddyq_periodic
WHERE name <> ALL(%(names)s::text[])
  AND updated_at < COALESCE(%(now)s::timestamptz, now()) - interval '1 day'
"""

# Periodic schedules as an operator sees and steers them (``maintenance.periodic``).

# Every row, for the list: the schedules configured and those no longer. The table holds one
# row per schedule (the enqueuer forgets those unconfigured for a day); the limit bounds it
# anyway. An infinite last_run_at reads as NULL.
LIST_PERIODIC_SCHEDULES = """
SELECT name, CASE WHEN isfinite(last_run_at) THEN last_run_at END, last_job_id, enabled
FROM eddyq_periodic
ORDER BY name
LIMIT %(limit)s
"""

# Enable or disable a schedule, creating its row (starting from its latest run, as the
# enqueuer would) if it has none yet. Enabling a disabled schedule moves it to its latest run
# (only forwards), so that it resumes from its next run instead of enqueuing one it missed.
# Sent after LOCK_PERIODIC_SCHEDULE, in its transaction, which said whether it changes.
SET_PERIODIC_ENABLED = """
INSERT INTO eddyq_periodic (name, last_run_at, enabled, updated_at)
VALUES (%(name)s, %(run_at)s, %(enabled)s, now())
ON CONFLICT (name) DO UPDATE
SET enabled = EXCLUDED.enabled,
    last_run_at = CASE WHEN EXCLUDED.enabled AND NOT eddyq_periodic.enabled
                       THEN GREATEST(eddyq_periodic.last_run_at, EXCLUDED.last_run_at)
                       ELSE eddyq_periodic.last_run_at END,
    updated_at = now()
"""


# Leader election.

LEADER_CHANNEL = "eddyq_leader"  # payload: an election whose leader resigned

ENSURE_LEADER_ROW = """
INSERT INTO eddyq_leader (name, leader_id, elected_at, expires_at)
VALUES (%(name)s, '', now(), '-infinity')
ON CONFLICT (name) DO NOTHING
"""

# Takes the row if its lease has expired or is already ours (a renewal), skipping it while
# another process holds it locked mid-campaign.
CAMPAIGN_FOR_LEADER = """
WITH candidate AS (
    SELECT name FROM eddyq_leader
    WHERE name = %(name)s AND (expires_at <= now() OR leader_id = %(leader_id)s)
    FOR UPDATE SKIP LOCKED
)
UPDATE eddyq_leader AS leader
SET elected_at = CASE WHEN leader.leader_id = %(leader_id)s AND leader.expires_at > now()
                      THEN leader.elected_at ELSE now() END,
    leader_id = %(leader_id)s,
    expires_at = now() + make_interval(secs => %(lease_seconds)s)
FROM candidate
WHERE leader.name = candidate.name
RETURNING leader.expires_at
"""

# Before each statement of a maintenance pass: the server cancels the statement, or ends a
# session idle in its transaction, once the leader lease this process holds is over. Inside a
# transaction they are local to it (%(local)s is true); in autocommit they are the session's, and
# RESTORE_TIMEOUTS puts back what FENCE_TIMEOUTS returned once the statement has run, so that
# no other user of the connection (a pool, PgBouncer) inherits them.
FENCE_TIMEOUTS = """
WITH prior AS MATERIALIZED (
    SELECT current_setting('statement_timeout') AS statement_timeout,
           current_setting('idle_in_transaction_session_timeout') AS idle_timeout
)
SELECT statement_timeout, idle_timeout,
       set_config('statement_timeout', %(statement_timeout)s, %(local)s),
       set_config('idle_in_transaction_session_timeout', %(idle_timeout)s, %(local)s)
FROM prior
"""
RESTORE_TIMEOUTS = """
SELECT set_config('statement_timeout', %(statement_timeout)s, false),
       set_config('idle_in_transaction_session_timeout', %(idle_timeout)s, false)
"""

# The elector's bound on its own statements, for its transaction only.
SET_LOCAL_STATEMENT_TIMEOUT = "SELECT set_config('statement_timeout', %(timeout)s, true)"

RESIGN_LEADER = """
WITH resigned AS (
    UPDATE eddyq_leader SET expires_at = now() - interval '1 millisecond'
    WHERE name = %(name)s AND leader_id = %(leader_id)s
    RETURNING name
)
SELECT count(pg_notify('eddyq_leader', name)) FROM resigned
"""


# Retention: the cleaner, the queue cleaner, the reindexer.
#
# The expiry conditions, and the cleaner's statements built around them, take positional
# parameters: the conditions are shared with Job.objects, which hides expired jobs and is
# compiled by Django, whose expressions use positional parameters. They are templates, rendered
# by retention.job_expiries: {now} is when they are evaluated (NOW_POSITIONAL for the cleaner,
# now() for Job.objects and the overview), {state}, {finalized_at} and {retention} are column
# references (bare, or as Django compiled them for its query) and {name} is a terminal state.
# Periods are subtracted in UTC, where a day is always 24 hours whatever the session's TimeZone.

NOW_POSITIONAL = "COALESCE(%s::timestamptz, now())"

# A terminal job on its state's RETENTION (it has no key for that state): expired once
# finalized_at + %s <= now. A range of eddyq_jobs_finalized_idx, walked in order. The key test
# is spelled so that the planner can estimate it from the column's statistics: as
# (retention -> name) IS NULL it guesses that 0.5% of rows pass, and sorts the whole backlog.
JOB_EXPIRED_BY_DEFAULT = (
    "{state} = '{name}'"
    " AND {finalized_at} <= (({now}) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC'"
    " AND ({retention} IS NULL OR NOT {retention} ? '{name}')"
)

# A terminal job with its own retention for its state, in seconds; null (or anything but a
# number, even a JSON array naming the state) keeps it forever. Compared as numeric seconds:
# exact to the microsecond, and no period is too long. Walks eddyq_jobs_retention_idx; the CASE
# guards the cast whatever order the planner evaluates the rest in.
JOB_EXPIRED_BY_OVERRIDE = (
    "{state} = '{name}' AND {retention} IS NOT NULL"
    " AND extract(epoch FROM ({now}) - {finalized_at})"
    " >= CASE WHEN jsonb_typeof({retention} -> '{name}') = 'number'"
    " THEN ({retention} ->> '{name}')::numeric END"
)

# A batch whose callback has fired, finalized RETENTION["batch"] (the second %s) before the
# cleaner's now (the first). Pending batches stay.
BATCH_EXPIRED = (
    "state = 'complete'"
    " AND finalized_at"
    " <= (COALESCE(%s::timestamptz, now()) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC'"
)

# Deletes up to %s rows of {table} (a psycopg.sql.Identifier) matching {condition}, oldest
# first, skipping rows others hold: short statements that never keep many locks for long.
# {resume} (_RESUME_AFTER) carries on from where the pass's previous batch ended, so that later
# batches don't walk again over the rows the condition keeps, nor over the dead ones that
# vacuum has not yet removed.
_DELETE_EXPIRED = """
WITH doomed AS (
    SELECT id FROM {table}
    WHERE {condition}{resume}
    ORDER BY finalized_at
    LIMIT %s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM {table} AS gone
    WHERE gone.id = ANY(ARRAY(SELECT id FROM doomed))
    RETURNING gone.finalized_at
)
SELECT count(*), max(finalized_at) FROM deleted
"""
_RESUME_AFTER = " AND finalized_at >= %s"


def delete_expired_statement(table: str, condition: str, *, resume: bool) -> psql.Composed:
    """The cleaner's delete of the rows of ``table`` matching ``condition`` (an expiry
    condition above): its first batch, or with ``resume`` a later one."""
    return psql.SQL(_DELETE_EXPIRED).format(
        table=psql.Identifier(table),
        condition=psql.SQL(condition),
        resume=psql.SQL(_RESUME_AFTER if resume else ""),
    )


# Workers unseen for WORKER_RETENTION (%(period)s): stopped long ago, or lost for good.
DELETE_FORGOTTEN_WORKERS = """
DELETE FROM eddyq_workers
WHERE last_seen_at
      <= (COALESCE(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC' - %(period)s::interval)
         AT TIME ZONE 'UTC'
"""

# Rate buckets full again: no row means a full bucket, so the keys of a task limited per key
# (one bucket each) do not pile up. A claim that refills a bucket meanwhile writes it a later
# full_at, which this delete re-reads before it deletes the row.
DELETE_FULL_RATE_BUCKETS = """
DELETE FROM eddyq_rate_buckets WHERE full_at <= COALESCE(%(now)s::timestamptz, now())
"""

# A queue's limits (limits.py), its row created if needed. A changed rate starts from a full
# bucket (its row deleted); an unchanged one (a worker applying EDDYQ["QUEUES"] as it starts)
# keeps the bucket it has.
SET_QUEUE_LIMITS = """
WITH previous AS (
    SELECT rate_limit, rate_period, rate_burst FROM eddyq_queues WHERE name = %(name)s
), limited AS (
    INSERT INTO eddyq_queues AS queue (
        name, created_at, updated_at, metadata, concurrency, rate_limit, rate_period, rate_burst
    )
    VALUES (
        %(name)s, now(), now(), '{}'::jsonb, %(concurrency)s, %(rate_limit)s, %(rate_period)s,
        %(rate_burst)s
    )
    ON CONFLICT (name) DO UPDATE
    SET concurrency = EXCLUDED.concurrency,
        rate_limit = EXCLUDED.rate_limit,
        rate_period = EXCLUDED.rate_period,
        rate_burst = EXCLUDED.rate_burst,
        updated_at = now()
)
DELETE FROM eddyq_rate_buckets
WHERE name = %(name)s
  AND NOT EXISTS (
      SELECT FROM previous
      WHERE (rate_limit, rate_period, rate_burst) IS NOT DISTINCT FROM
            (%(rate_limit)s::integer, %(rate_period)s::float8, %(rate_burst)s::integer)
  )
"""

# Queues not updated within QUEUE_RETENTION (%(period)s), except paused or limited ones
# (deleting the row would resume them, or lift their limits) and those with unfinished jobs.
# The states are spelled as an OR so that each arm can use the partial index made for it.
DELETE_STALE_QUEUES = """
WITH stale AS (
    SELECT name FROM eddyq_queues AS stale_queue
    WHERE stale_queue.paused_at IS NULL
      AND stale_queue.concurrency IS NULL
      AND stale_queue.rate_limit IS NULL
      AND stale_queue.updated_at
          <= (COALESCE(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC' - %(period)s::interval)
             AT TIME ZONE 'UTC'
      AND NOT EXISTS (
          SELECT 1 FROM eddyq_jobs AS job
          WHERE job.queue = stale_queue.name
            AND ((job.state = 'available' AND job.limit_key IS NULL)
                 OR (job.state = 'available' AND job.limit_key IS NOT NULL)
                 OR job.state IN ('scheduled', 'retryable')
                 OR job.state = 'running')
      )
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM eddyq_queues AS gone
    USING stale
    WHERE gone.name = stale.name
    RETURNING gone.name
)
SELECT count(*) FROM deleted
"""

# The index of eddyq_jobs called %(name)s, found as REINDEX would find it (the search_path);
# no row if there is none. The name is one identifier, never read as schema.name.
REINDEX_FIND_INDEX = """
SELECT index_namespace.nspname, index_class.relname
FROM pg_index AS ix
JOIN pg_class AS index_class ON index_class.oid = ix.indexrelid
JOIN pg_namespace AS index_namespace ON index_namespace.oid = index_class.relnamespace
WHERE ix.indexrelid = to_regclass(quote_ident(%(name)s))
  AND ix.indrelid = to_regclass('eddyq_jobs')
"""

# The names of %(names)s that are not indexes of eddyq_jobs; none before the table exists.
REINDEX_UNKNOWN_INDEXES = """
SELECT given.name
FROM unnest(%(names)s::text[]) WITH ORDINALITY AS given(name, position)
WHERE to_regclass('eddyq_jobs') IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM pg_index AS ix
      WHERE ix.indexrelid = to_regclass(quote_ident(given.name))
        AND ix.indrelid = to_regclass('eddyq_jobs')
  )
ORDER BY given.position
"""

# Index builds under way on eddyq_jobs in this database (CREATE INDEX, REINDEX, concurrently or
# not) by other sessions. A build whose table this role may not see counts too: without
# pg_read_all_stats, relid of other roles' sessions reads NULL.
REINDEX_BUILDS_IN_PROGRESS = """
SELECT progress.pid, progress.command
FROM pg_stat_progress_create_index AS progress
WHERE progress.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND (progress.relid = to_regclass('eddyq_jobs') OR progress.relid IS NULL)
  AND progress.pid <> pg_backend_pid()
ORDER BY progress.pid
"""

# What an interrupted REINDEX CONCURRENTLY of %(name)s leaves behind: invalid indexes named
# <name>_ccnew, <name>_ccnew1, ..., <name>_ccold, ... They are useless, yet still updated by
# every write.
REINDEX_LEFTOVERS = """
SELECT leftover_namespace.nspname, leftover.relname
FROM pg_index AS ix
JOIN pg_class AS leftover ON leftover.oid = ix.indexrelid
JOIN pg_namespace AS leftover_namespace ON leftover_namespace.oid = leftover.relnamespace
WHERE ix.indrelid = to_regclass('eddyq_jobs')
  AND NOT ix.indisvalid
  AND left(leftover.relname, length(%(name)s)) = %(name)s
  AND substr(leftover.relname, length(%(name)s) + 1) ~ '^_cc(new|old)[0-9]*$'
ORDER BY leftover.relname
"""

# {index} is a psycopg.sql.Identifier of an index found above, never text as given.
REINDEX_INDEX = "REINDEX INDEX CONCURRENTLY {index}"
DROP_LEFTOVER_INDEX = "DROP INDEX CONCURRENTLY IF EXISTS {index}"


# Queues, cancellation and retry.

CONTROL_CHANNEL = "eddyq_control"  # payload: "cancel:<job id>" for the worker running it

SET_QUEUE_PAUSED = """
INSERT INTO eddyq_queues (name, paused_at, created_at, updated_at, metadata)
VALUES (%(name)s, CASE WHEN %(paused)s THEN now() END, now(), now(), '{}'::jsonb)
ON CONFLICT (name) DO UPDATE
SET paused_at = CASE WHEN %(paused)s THEN COALESCE(eddyq_queues.paused_at, now()) END,
    updated_at = now()
RETURNING name
"""

NOTIFY_QUEUE = "SELECT pg_notify('eddyq_jobs', %(name)s)"

# Which jobs cancel, retry and delete may change: one rule each, shared by the change and by
# its dry run, and the same for one job (the admin's button, Job.cancel) as for a million (the
# bulk operations, which send a batch of ids at a time).
_CANCEL_RULE = (
    "state IN ('pending', 'scheduled', 'available', 'running', 'retryable') "
    "AND (state <> 'running' OR cancel_requested_at IS NULL)"
)
_RETRY_RULE = "state IN ('failed', 'cancelled', 'retryable', 'scheduled')"
# Only ended jobs, as retention would: a job deleted while it runs would go on running.
_DELETE_RULE = "state IN ('completed', 'failed', 'cancelled')"

# A job not yet running is cancelled at once; a running one is flagged for its worker, which
# learns of it by notification or at its next heartbeat.
CANCEL_JOBS = f"""
WITH cancelled AS (
    UPDATE eddyq_jobs
    SET state = CASE WHEN state = 'running' THEN state ELSE 'cancelled' END,
        finalized_at = CASE WHEN state = 'running' THEN finalized_at ELSE now() END,
        cancel_requested_at = COALESCE(cancel_requested_at, now())
    WHERE id = ANY(%(ids)s::bigint[])
      AND {_CANCEL_RULE}
    RETURNING id, task, state, batch_id
)
SELECT id, task, state, batch_id,
       (SELECT count(pg_notify('eddyq_control', 'cancel:' || id)) FROM cancelled
        WHERE state = 'running')
FROM cancelled
"""

# Each queue that got jobs back is notified once, however many of its jobs a batch retried.
RETRY_JOBS = f"""
WITH retried AS (
    UPDATE eddyq_jobs
    SET state = 'available',
        run_at = now(),
        finalized_at = NULL,
        result = NULL,
        cancel_requested_at = NULL,
        max_attempts = GREATEST(max_attempts, attempt + 1)
    WHERE id = ANY(%(ids)s::bigint[]) AND {_RETRY_RULE}
    RETURNING id, task, state, queue
)
SELECT id, task, state, (SELECT count(pg_notify('eddyq_jobs', queue))
            FROM (SELECT DISTINCT queue FROM retried) AS woken)
FROM retried
"""

DELETE_JOBS = f"""
DELETE FROM eddyq_jobs
WHERE id = ANY(%(ids)s::bigint[]) AND {_DELETE_RULE}
RETURNING id, task, state
"""

# The dry runs: which of the ids the statements above would change, and each one's state (a
# running job would only be asked to stop).
CANCELLABLE_JOBS = f"""
SELECT id, task, state FROM eddyq_jobs WHERE id = ANY(%(ids)s::bigint[]) AND {_CANCEL_RULE}
"""
RETRIABLE_JOBS = f"""
SELECT id, task, state FROM eddyq_jobs WHERE id = ANY(%(ids)s::bigint[]) AND {_RETRY_RULE}
"""
DELETABLE_JOBS = f"""
SELECT id, task, state FROM eddyq_jobs WHERE id = ANY(%(ids)s::bigint[]) AND {_DELETE_RULE}
"""

# The lowest and highest job ids, read off the primary key's ends: where a bulk operation starts
# and stops walking, so that jobs enqueued (or failing) while it runs are not in its set.
JOB_ID_RANGE = "SELECT min(id), max(id) FROM eddyq_jobs"

JOB_STATE = "SELECT state FROM eddyq_jobs WHERE id = %(id)s"


# Batches.

# Locks the pending batches so that of two workers finishing a batch's last jobs at the same
# instant, the second waits and then, in its next statement, sees the first's job as finished.
LOCK_PENDING_BATCHES = """
SELECT id FROM eddyq_batches
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
ORDER BY id
FOR UPDATE
"""

# Run after LOCK_PENDING_BATCHES, as its own statement: in READ COMMITTED it sees every job
# committed before the lock was granted.
COMPLETE_BATCHES = """
UPDATE eddyq_batches AS batch
SET state = 'complete', finalized_at = now()
WHERE batch.id = ANY(%(ids)s::bigint[])
  AND batch.state = 'pending'
  AND batch.sealed
  AND NOT EXISTS (
      SELECT FROM eddyq_jobs AS job
      WHERE job.batch_id = batch.id
        AND job.state IN ('scheduled', 'available', 'running', 'retryable')
  )
RETURNING batch.id, batch.callback_task, batch.callback_args, batch.callback_kwargs,
          batch.metadata,
          (SELECT COALESCE(jsonb_object_agg(counted.state, counted.jobs), '{}'::jsonb)
           FROM (SELECT state, count(*) AS jobs FROM eddyq_jobs
                 WHERE batch_id = batch.id GROUP BY state) AS counted)
"""

SEAL_BATCH = "UPDATE eddyq_batches SET sealed = true WHERE id = %(id)s"

SET_BATCH_CALLBACK_JOB = "UPDATE eddyq_batches SET callback_job = %(job_id)s WHERE id = %(id)s"


# Workflows (workflows.py, docs/workflows.md): steps are jobs; eddyq_workflow_steps holds each
# step's name, how many of its dependencies it still waits on and how it ended;
# eddyq_workflow_edges its dependencies, keyed upstream first. A step that waits is 'pending',
# a state no claim reads: the claims are unchanged, and a workflow costs a plain job nothing.
#
# Locks are taken in one order everywhere, so that two transactions never deadlock: the ended
# (or reopened) steps' rows, then their dependents' rows, each set in id order, then the
# workflows' rows in id order. Each step of that order is a statement of its own: the next one's
# snapshot then sees whatever the lock waited for.

# A new workflow's row ({workflow} of _INSERT_STEPS).
_NEW_WORKFLOW = """INSERT INTO eddyq_workflows (
        name, state, retention, steps, unfinished, failed, created_at
    )
    VALUES (%(name)s, 'running', %(retention)s, %(count)s, %(count)s, 0, now())
    RETURNING id"""

# Steps added to a running workflow (by one of its steps): counted in, unless it has ended.
_GROWN_WORKFLOW = """UPDATE eddyq_workflows
    SET steps = steps + %(count)s, unfinished = unfinished + %(count)s
    WHERE id = %(workflow_id)s AND finalized_at IS NULL
    RETURNING id"""

# The steps (an element of each array per step) and their dependencies (an element of each
# edge_ array per edge: the upstream by its position among the steps, or, already stored, by its
# job id) in one statement. Ids are drawn first, into an array that edges index by position: no
# join of the steps with themselves, whose estimate (the planner knows nothing of a CTE's
# positions) would cost a large graph a second of JIT compilation for milliseconds of work.
# A step with dependencies left to wait on is 'pending'. Its jobs are kept while the workflow
# runs (a dependent may still read a result); the workflow's end sets when they expire. Returns
# the workflow's id and the steps' job ids in their order (none if the workflow has ended).
_INSERT_STEPS = """
WITH workflow AS (
    {workflow}
), drawn AS (
    SELECT array_agg(nextval('eddyq_jobs_id_seq') ORDER BY position) AS ids
    FROM generate_series(1, %(count)s) AS position
    WHERE EXISTS (SELECT FROM workflow)
), input AS (
    SELECT input.*, drawn.ids[input.position] AS id,
           COALESCE(given_run_at, now() + make_interval(secs => delay)) AS due_at
    FROM unnest(
        %(tasks)s::text[], %(args)s::jsonb[], %(kwargs)s::jsonb[], %(queues)s::text[],
        %(priorities)s::smallint[], %(max_attempts)s::integer[], %(run_ats)s::timestamptz[],
        %(delays)s::float8[], %(metadatas)s::jsonb[], %(names)s::text[], %(waiting)s::integer[],
        %(limit_keys)s::text[]
    ) WITH ORDINALITY AS input(
        task, args, kwargs, queue, priority, max_attempts, given_run_at, delay, metadata, name,
        waiting, limit_key, position
    )
    CROSS JOIN drawn
    WHERE drawn.ids IS NOT NULL
){touch_queues}, inserted AS (
    INSERT INTO eddyq_jobs (
        id, task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
        errors, retention, metadata, limit_key
    )
    SELECT input.id, task, args, kwargs, queue, priority,
           CASE WHEN waiting > 0 THEN 'pending'
                WHEN due_at > now() THEN 'scheduled' ELSE 'available' END,
           0, max_attempts, due_at, now(), '[]'::jsonb,
           '{{"completed": null, "failed": null, "cancelled": null}}'::jsonb,
           metadata || jsonb_build_object('workflow', workflow.id, 'workflow_step', input.name),
           limit_key
    FROM input CROSS JOIN workflow
    ORDER BY position
    RETURNING state, queue
), steps AS (
    INSERT INTO eddyq_workflow_steps (job_id, workflow_id, name, waiting_on)
    SELECT input.id, workflow.id, input.name, input.waiting FROM input CROSS JOIN workflow
), edges AS (
    INSERT INTO eddyq_workflow_edges (upstream_id, downstream_id, ignore_failure)
    SELECT COALESCE(drawn.ids[edge.upstream_position], edge.upstream_job),
           drawn.ids[edge.downstream_position], edge.ignore_failure
    FROM unnest(
        %(edge_from)s::integer[], %(edge_from_jobs)s::bigint[], %(edge_to)s::integer[],
        %(edge_ignore)s::boolean[]
    ) AS edge(upstream_position, upstream_job, downstream_position, ignore_failure)
    CROSS JOIN drawn
    WHERE drawn.ids IS NOT NULL
)
SELECT workflow.id, drawn.ids, (
    SELECT count(pg_notify('eddyq_jobs', queue))
           + (SELECT count(pg_notify('eddyq_scheduled', ''))
              FROM (SELECT FROM inserted WHERE state = 'scheduled' LIMIT 1) AS waiting)
    FROM (SELECT DISTINCT queue FROM inserted WHERE state = 'available') AS woken
)
FROM workflow CROSS JOIN drawn
"""

INSERT_WORKFLOW = _INSERT_STEPS.format(workflow=_NEW_WORKFLOW, touch_queues=_TOUCH_QUEUES)
ADD_WORKFLOW_STEPS = _INSERT_STEPS.format(workflow=_GROWN_WORKFLOW, touch_queues=_TOUCH_QUEUES)

# Before ADD_WORKFLOW_STEPS, the stored steps the new ones depend on, by name, held (FOR SHARE)
# until the transaction ends: a step that ends meanwhile waits, and its release then sees the
# new edges; one that ended before is read as it ended.
LOCK_UPSTREAM_STEPS = """
SELECT job_id, name, ended_state FROM eddyq_workflow_steps
WHERE workflow_id = %(workflow_id)s AND name = ANY(%(names)s::text[])
ORDER BY job_id
FOR SHARE
"""

# The steps among %(ids)s whose jobs have just ended, marked ended: once, whichever path ended
# them (a worker's finish, the rescuer, a cancel), however often this is sent for them. Each
# job's state is read by its id (a subquery per step): as a join, the planner, its statistics
# taken before a burst of completions, walked every ended job by state, O(the table) a pass.
END_STEPS = """
WITH locked AS (
    SELECT job_id FROM eddyq_workflow_steps
    WHERE job_id = ANY(%(ids)s::bigint[]) AND ended_state IS NULL
    ORDER BY job_id
    FOR UPDATE
), ended AS (
    SELECT locked.job_id,
           (SELECT job.state FROM eddyq_jobs AS job WHERE job.id = locked.job_id) AS state
    FROM locked
)
UPDATE eddyq_workflow_steps AS step
SET ended_state = ended.state
FROM ended
WHERE step.job_id = ended.job_id
  AND ended.state IN ('completed', 'failed', 'cancelled')
RETURNING step.job_id, step.workflow_id, step.ended_state
"""

# The pending steps that depend, through edges without ignore_failure, on the steps %(ids)s
# (ended failed or cancelled), directly or not: cancelled, naming the step that started it (a
# cause that was itself cancelled because of another passes that one on).
CANCEL_DEPENDENTS = """
WITH RECURSIVE doomed(job_id, root) AS (
    SELECT edge.downstream_id, COALESCE(cause.cancelled_by, cause.job_id)
    FROM eddyq_workflow_steps AS cause
    JOIN eddyq_workflow_edges AS edge
      ON edge.upstream_id = cause.job_id AND NOT edge.ignore_failure
    WHERE cause.job_id = ANY(%(ids)s::bigint[])
    UNION
    SELECT edge.downstream_id, doomed.root
    FROM doomed
    JOIN eddyq_workflow_edges AS edge
      ON edge.upstream_id = doomed.job_id AND NOT edge.ignore_failure
), picked AS (
    SELECT DISTINCT ON (job_id) job_id, root FROM doomed ORDER BY job_id, root
), locked AS (
    SELECT step.job_id, picked.root
    FROM eddyq_workflow_steps AS step
    JOIN picked ON picked.job_id = step.job_id
    JOIN eddyq_jobs AS job ON job.id = step.job_id
    WHERE step.ended_state IS NULL AND job.state = 'pending'
    ORDER BY step.job_id
    FOR UPDATE OF step, job
), cancelled_steps AS (
    UPDATE eddyq_workflow_steps AS step
    SET ended_state = 'cancelled', cancelled_by = locked.root
    FROM locked
    WHERE step.job_id = locked.job_id
    RETURNING step.job_id, step.workflow_id
), cancelled_jobs AS (
    UPDATE eddyq_jobs AS job
    SET state = 'cancelled',
        finalized_at = now(),
        errors = job.errors || jsonb_build_array(jsonb_build_object(
            'attempt', job.attempt,
            'error', format('DependencyFailed: step %%s (job %%s) ended %%s',
                            cause.name, cause.job_id, cause.ended_state),
            'at', now()))
    FROM locked
    JOIN eddyq_workflow_steps AS cause ON cause.job_id = locked.root
    WHERE job.id = locked.job_id
)
SELECT job_id, workflow_id FROM cancelled_steps
"""

# The dependents of the steps %(ids)s that just ended (%(completed)s: whether each completed):
# each edge an ended step satisfies (it completed, or its dependent ignores failures) is counted
# off its dependent once, and a dependent that waits on nothing more is released. The dependents
# are locked in id order before their counts change: siblings ending at once on two workers
# take turns, and the second sees the first's count. O(the ended steps' edges): they are found
# by their upstream ids as given (ANY), since joined to the ended steps alone, the edges of a
# few thousand steps were read whole at every pass.
RELEASE_DEPENDENTS = """
WITH ended AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(completed)s::boolean[]) AS ended(job_id, completed)
), satisfied AS (
    SELECT edge.downstream_id AS job_id, count(*) AS edges
    FROM ended
    JOIN eddyq_workflow_edges AS edge ON edge.upstream_id = ended.job_id
    WHERE edge.upstream_id = ANY(%(ids)s::bigint[])
      AND (ended.completed OR edge.ignore_failure)
    GROUP BY edge.downstream_id
), locked AS (
    SELECT step.job_id, satisfied.edges
    FROM eddyq_workflow_steps AS step
    JOIN satisfied ON satisfied.job_id = step.job_id
    WHERE step.ended_state IS NULL
    ORDER BY step.job_id
    FOR UPDATE OF step
), counted AS (
    UPDATE eddyq_workflow_steps AS step
    SET waiting_on = GREATEST(step.waiting_on - locked.edges, 0)
    FROM locked
    WHERE step.job_id = locked.job_id
    RETURNING step.job_id, step.waiting_on
), released AS (
    UPDATE eddyq_jobs AS job
    SET state = CASE WHEN job.run_at > now() THEN 'scheduled' ELSE 'available' END
    FROM counted
    WHERE job.id = counted.job_id AND counted.waiting_on = 0 AND job.state = 'pending'
    RETURNING job.id, job.state, job.queue
)
SELECT count(*), (
    SELECT count(pg_notify('eddyq_jobs', queue))
           + (SELECT count(pg_notify('eddyq_scheduled', ''))
              FROM (SELECT FROM released WHERE state = 'scheduled' LIMIT 1) AS waiting)
    FROM (SELECT DISTINCT queue FROM released WHERE state = 'available') AS woken
)
FROM released
"""

# The workflows whose steps ended (%(finished)s > 0) or were reopened by a retry (< 0), with
# %(failed)s of them failed or cancelled: their counts, and their state once the last step has
# ended (or again when a retry reopens one). A workflow that ends sets each of its jobs'
# retention to expire with it, RETENTION seconds after it ended; one reopened keeps them again.
# O(its steps), once per workflow's end. The workflows are found by their ids as given (ANY):
# matched against the CTE, the planner scanned the whole table at every pass. Each one's change
# is joined to it as it is locked, once: joined again in the update, the generic plan matched
# every change with every locked workflow.
WORKFLOW_PROGRESS = """
WITH change AS (
    SELECT workflow_id, sum(finished)::integer AS finished, sum(failed)::integer AS failed
    FROM unnest(%(workflow_ids)s::bigint[], %(finished)s::integer[], %(failed)s::integer[])
         AS change(workflow_id, finished, failed)
    GROUP BY workflow_id
), locked AS (
    SELECT workflow.id, workflow.finalized_at IS NOT NULL AS was_ended,
           change.finished, change.failed
    FROM eddyq_workflows AS workflow
    JOIN change ON change.workflow_id = workflow.id
    WHERE workflow.id = ANY(%(workflow_ids)s::bigint[])
    ORDER BY workflow.id
    FOR UPDATE OF workflow
), progressed AS (
    UPDATE eddyq_workflows AS workflow
    SET unfinished = GREATEST(workflow.unfinished - locked.finished, 0),
        failed = GREATEST(workflow.failed + locked.failed, 0),
        state = CASE
            WHEN locked.finished < 0 THEN 'running'
            WHEN workflow.state = 'cancelled' THEN 'cancelled'
            WHEN workflow.unfinished - locked.finished > 0 THEN 'running'
            WHEN workflow.failed + locked.failed > 0 THEN 'failed'
            ELSE 'completed' END,
        finalized_at = CASE WHEN workflow.unfinished - locked.finished <= 0
                            THEN COALESCE(workflow.finalized_at, now()) END
    FROM locked
    WHERE workflow.id = locked.id
    RETURNING workflow.id, workflow.finalized_at, workflow.retention, locked.was_ended
), kept AS (
    UPDATE eddyq_jobs AS job
    SET retention = CASE
        WHEN progressed.finalized_at IS NULL
            THEN '{"completed": null, "failed": null, "cancelled": null}'::jsonb
        ELSE jsonb_build_object(
            job.state,
            extract(epoch FROM progressed.finalized_at - job.finalized_at)::float8
            + progressed.retention)
        END
    FROM progressed
    JOIN eddyq_workflow_steps AS step ON step.workflow_id = progressed.id
    WHERE job.id = step.job_id AND (progressed.finalized_at IS NOT NULL) <> progressed.was_ended
)
SELECT id FROM progressed WHERE finalized_at IS NOT NULL AND NOT was_ended
"""

# A retry of the steps %(ids)s: they, and the steps they cancelled, are unfinished again
# (REOPEN_STEPS); their dependents' rows are locked (LOCK_STEPS), then counted anew from their
# edges (RECOUNT_STEPS), whose snapshot sees every step that ended before the lock.
REOPEN_STEPS = """
WITH locked AS (
    SELECT job_id FROM eddyq_workflow_steps
    WHERE (job_id = ANY(%(ids)s::bigint[]) OR cancelled_by = ANY(%(ids)s::bigint[]))
      AND ended_state IN ('failed', 'cancelled')
    ORDER BY job_id
    FOR UPDATE
)
UPDATE eddyq_workflow_steps AS step
SET ended_state = NULL, cancelled_by = NULL
FROM locked
WHERE step.job_id = locked.job_id
RETURNING step.job_id, step.workflow_id
"""

LOCK_STEPS = """
SELECT job_id FROM eddyq_workflow_steps
WHERE ended_state IS NULL
  AND (job_id = ANY(%(ids)s::bigint[])
       OR job_id IN (SELECT downstream_id FROM eddyq_workflow_edges
                     WHERE upstream_id = ANY(%(ids)s::bigint[])))
ORDER BY job_id
FOR UPDATE
"""

# A reopened step waits again on its dependencies not yet met (pending), or runs now; a pending
# dependent of it that counted it as met waits for it again.
RECOUNT_STEPS = """
WITH counted AS (
    UPDATE eddyq_workflow_steps AS step
    SET waiting_on = (
        SELECT count(*) FROM eddyq_workflow_edges AS edge
        JOIN eddyq_workflow_steps AS upstream ON upstream.job_id = edge.upstream_id
        WHERE edge.downstream_id = step.job_id
          AND (upstream.ended_state IS NULL
               OR (upstream.ended_state <> 'completed' AND NOT edge.ignore_failure))
    )
    WHERE step.job_id = ANY(%(ids)s::bigint[])
    RETURNING step.job_id, step.waiting_on
), moved AS (
    UPDATE eddyq_jobs AS job
    SET state = CASE WHEN counted.waiting_on > 0 THEN 'pending'
                     WHEN job.run_at > now() THEN 'scheduled' ELSE 'available' END,
        finalized_at = NULL,
        cancel_requested_at = NULL,
        result = NULL
    FROM counted
    WHERE job.id = counted.job_id
      AND (job.state = 'cancelled'
           OR (job.state IN ('available', 'scheduled') AND counted.waiting_on > 0)
           OR (job.state = 'pending' AND counted.waiting_on = 0))
    RETURNING job.id, job.state, job.queue
)
SELECT count(*), (
    SELECT count(pg_notify('eddyq_jobs', queue))
    FROM (SELECT DISTINCT queue FROM moved WHERE state = 'available') AS woken
)
FROM moved
"""

# The failed or cancelled steps that some of the steps %(ids)s depend on without ignoring
# failures: after a retry, they cancel again the reopened steps that still wait on them.
FAILED_UPSTREAMS = """
SELECT DISTINCT upstream.job_id
FROM eddyq_workflow_edges AS edge
JOIN eddyq_workflow_steps AS upstream ON upstream.job_id = edge.upstream_id
WHERE edge.downstream_id = ANY(%(ids)s::bigint[])
  AND NOT edge.ignore_failure
  AND upstream.ended_state IN ('failed', 'cancelled')
"""

# A workflow's unfinished steps (to cancel it), and the failed and cancelled ones that no other
# step cancelled (to retry it: the others come back with them).
UNFINISHED_STEPS = """
SELECT job_id FROM eddyq_workflow_steps
WHERE workflow_id = %(id)s AND ended_state IS NULL
ORDER BY job_id
"""
FAILED_STEPS = """
SELECT job_id FROM eddyq_workflow_steps
WHERE workflow_id = %(id)s AND ended_state IN ('failed', 'cancelled') AND cancelled_by IS NULL
ORDER BY job_id
"""

# After its steps were cancelled: the workflow says it was, unless it had completed.
MARK_WORKFLOW_CANCELLED = """
UPDATE eddyq_workflows SET state = 'cancelled' WHERE id = %(id)s AND state <> 'completed'
"""

# The step a job is, by its id (current_workflow()): its workflow and name, as its step row
# says, never as the job's metadata does (a value in a row that anyone who writes jobs could set).
CURRENT_STEP = """
SELECT workflow_id, name FROM eddyq_workflow_steps WHERE job_id = %(job_id)s
"""

# What a step reads: the results of the steps it depends on, and one step's by name.
DEPENDENCY_RESULTS = """
SELECT upstream.name, job.state, job.result
FROM eddyq_workflow_edges AS edge
JOIN eddyq_workflow_steps AS upstream ON upstream.job_id = edge.upstream_id
JOIN eddyq_jobs AS job ON job.id = edge.upstream_id
WHERE edge.downstream_id = %(job_id)s
ORDER BY upstream.name
"""
STEP_RESULT = """
SELECT job.state, job.result
FROM eddyq_workflow_steps AS step
JOIN eddyq_jobs AS job ON job.id = step.job_id
WHERE step.workflow_id = %(workflow_id)s AND step.name = %(name)s
"""

# The cleaner: up to %(limit)s workflows past their retention, with their steps, edges and the
# jobs left of them (the cleaner's job sweep may have deleted those already: they expire
# together).
DELETE_EXPIRED_WORKFLOWS = """
WITH doomed AS (
    SELECT id FROM eddyq_workflows
    WHERE finalized_at IS NOT NULL AND retention IS NOT NULL
      AND finalized_at + make_interval(secs => retention)
          <= COALESCE(%(now)s::timestamptz, now())
    ORDER BY finalized_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), steps AS (
    DELETE FROM eddyq_workflow_steps AS step
    USING doomed
    WHERE step.workflow_id = doomed.id
    RETURNING step.job_id
), edges AS (
    DELETE FROM eddyq_workflow_edges AS edge
    USING steps
    WHERE edge.upstream_id = steps.job_id
), jobs AS (
    DELETE FROM eddyq_jobs AS job
    USING steps
    WHERE job.id = steps.job_id AND job.state IN ('completed', 'failed', 'cancelled')
), deleted AS (
    DELETE FROM eddyq_workflows AS workflow
    USING doomed
    WHERE workflow.id = doomed.id
    RETURNING 1
)
SELECT count(*) FROM deleted
"""

# A workflow past its retention, for WorkflowRun.objects, which hides it as Job.objects hides
# expired jobs (a condition Django compiles into its query).
WORKFLOW_EXPIRED = (
    "COALESCE(eddyq_workflows.finalized_at + make_interval(secs => eddyq_workflows.retention)"
    " <= now(), false)"
)


# Inspection: the admin's bounded reads (inspection.py).

# The planner's estimate of the rows of the table %(table)s: -1 (or NULL) until it is first
# vacuumed or analyzed.
TABLE_ESTIMATE = "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%(table)s)"

# The planner's statistics of eddyq_jobs.state: its most common values, their frequencies,
# and the table's estimated rows.
STATE_STATISTICS = """
SELECT stats.most_common_vals::text::text[], stats.most_common_freqs, class.reltuples
FROM pg_class AS class
JOIN pg_namespace AS namespace ON namespace.oid = class.relnamespace
LEFT JOIN pg_stats AS stats
  ON stats.schemaname = namespace.nspname AND stats.tablename = class.relname
 AND stats.attname = 'state'
WHERE class.oid = to_regclass('eddyq_jobs')
"""

# Visible jobs per state, and running jobs past their lease, for the overview above the job
# list: counts that each stop past a limit (each LIMIT %s), past which the overview estimates.
# Index scans, most of them index-only. A terminal state's visible jobs are all its jobs minus
# its expired ones ({completed_expired}, ...: retention.job_expiries ORed, with their own
# positional parameters before the LIMIT's), so that neither count reads the heap for more rows
# than expired ones: few, while the cleaner keeps up.
_STATE_COUNTS = """
SELECT (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE state = 'pending' LIMIT %s) AS job)
           AS pending,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE state = 'scheduled' LIMIT %s) AS job)
           AS scheduled,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE state = 'available' LIMIT %s) AS job)
           AS available,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE state = 'running' LIMIT %s) AS job)
           AS running,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE state = 'retryable' LIMIT %s) AS job)
           AS retryable,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE state = 'completed' LIMIT %s) AS job)
           AS completed,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE state = 'failed' LIMIT %s) AS job)
           AS failed,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE state = 'cancelled' LIMIT %s) AS job)
           AS cancelled,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE {completed_expired} LIMIT %s) AS job)
           AS completed_expired,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE {failed_expired} LIMIT %s) AS job)
           AS failed_expired,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE {cancelled_expired} LIMIT %s) AS job)
           AS cancelled_expired,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs
                              WHERE state = 'running' AND locked_until < now()
                              LIMIT %s) AS job)
           AS stuck
"""


def state_counts_statement(expired: Mapping[str, str]) -> str:
    """The overview's counts per state, ``expired`` giving each terminal state's condition of
    expiry."""
    return _STATE_COUNTS.format(
        **{f"{state}_expired": condition for state, condition in expired.items()}
    )


# A queue's available jobs, counted up to a limit (%s, given twice) along
# eddyq_jobs_queue_claim_idx and eddyq_jobs_keyed_claim_idx (the jobs with a limit key), and
# its running jobs, along eddyq_jobs_lease_idx (no more than the fleet runs at once): for the
# row of eddyq_queues a query of Django's reads (the overview above the job list, the queue
# list), which annotates it with them.
QUEUE_AVAILABLE_JOBS = """
SELECT (SELECT count(*) FROM (SELECT FROM eddyq_jobs AS job
                              WHERE job.state = 'available' AND job.limit_key IS NULL
                                AND job.queue = eddyq_queues.name
                              LIMIT %s) AS available)
       + (SELECT count(*) FROM (SELECT FROM eddyq_jobs AS job
                                WHERE job.state = 'available' AND job.limit_key IS NOT NULL
                                  AND job.queue = eddyq_queues.name
                                LIMIT %s) AS keyed)
"""
QUEUE_RUNNING_JOBS = """
SELECT count(*) FROM eddyq_jobs AS job
WHERE job.state = 'running' AND job.queue = eddyq_queues.name
"""

# The distinct tasks of the jobs eddyq_jobs_task_idx holds (all but the available and running
# ones), by a skip scan of it: each step one index probe for the next task after the previous
# one; the LIMIT stops the recursion. The state test is the index's own predicate.
TASK_NAMES = """
WITH RECURSIVE tasks(task) AS (
    (SELECT task FROM eddyq_jobs
     WHERE NOT (state IN ('available', 'running'))
     ORDER BY task LIMIT 1)
    UNION ALL
    SELECT (SELECT job.task FROM eddyq_jobs AS job
            WHERE job.task > previous.task AND NOT (job.state IN ('available', 'running'))
            ORDER BY job.task LIMIT 1)
    FROM tasks AS previous
    WHERE previous.task IS NOT NULL
)
SELECT task FROM tasks WHERE task IS NOT NULL LIMIT %(limit)s
"""


# Health and latency: eddyq_health's probes and the latency gauge (inspection.queue_latencies).

# Per queue, how long its oldest due available job has waited: seconds since its run_at, by the
# database's clock. Queues without a due available job have no row. The jobs with a limit key
# are left out: they wait for their key's limit by design, and no index holds them in priority
# and run_at order per queue. Never a read of every available job: eddyq_jobs_queue_claim_idx
# (queue, priority DESC, run_at, id) holds each (queue, priority) pair's jobs oldest first, so a
# skip scan of the pairs (the recursion) reads the first entry of each, one or two index probes
# per pair (the next priority of the same queue, else the first of the next queue; the LIMIT 1
# stops at the first that finds one), and a queue's oldest job is the oldest of its pairs'
# firsts. The epochs are subtracted, not the timestamps:
# PostgreSQL before 17 cannot subtract a run_at of -infinity, whose wait is Infinity here.
QUEUE_LATENCY = """
WITH RECURSIVE firsts(queue, priority, run_at) AS (
    (SELECT queue, priority, run_at FROM eddyq_jobs
     WHERE state = 'available' AND limit_key IS NULL
     ORDER BY queue, priority DESC, run_at, id
     LIMIT 1)
    UNION ALL
    SELECT next.queue, next.priority, next.run_at
    FROM firsts AS previous
    CROSS JOIN LATERAL (
        (SELECT job.queue, job.priority, job.run_at FROM eddyq_jobs AS job
         WHERE job.state = 'available' AND job.limit_key IS NULL AND job.queue = previous.queue
           AND job.priority < previous.priority
         ORDER BY job.priority DESC, job.run_at, job.id
         LIMIT 1)
        UNION ALL
        (SELECT job.queue, job.priority, job.run_at FROM eddyq_jobs AS job
         WHERE job.state = 'available' AND job.limit_key IS NULL AND job.queue > previous.queue
         ORDER BY job.queue, job.priority DESC, job.run_at, job.id
         LIMIT 1)
        LIMIT 1
    ) AS next
)
SELECT queue, (extract(epoch FROM now()) - extract(epoch FROM min(run_at)))::float8
FROM firsts
WHERE run_at <= now()
GROUP BY queue
ORDER BY queue
"""


# Metrics: the gauges a Prometheus scrape reads (metrics.py).

# Everything a scrape shows of the database, in one statement of bounded cost, whatever the size
# of the table: rows of (kind, queue, state, jobs, seconds).
# - 'queue': each queue of eddyq_queues (the first %(queue_limit)s by name), whether it is paused
#   (jobs 1) or not, so that every queue has its gauges, at zero when it has no jobs.
# - 'latency': QUEUE_LATENCY's rows, how long each queue's oldest due available job has waited.
# - 'available': each of those queues' available jobs, counted along eddyq_jobs_queue_claim_idx
#   and eddyq_jobs_keyed_claim_idx up to %(limit)s each (one more than what is counted
#   exactly), index-only once vacuum has passed.
# - 'sampled': the other states' jobs per queue and state, from at most %(limit)s running jobs
#   (eddyq_jobs_lease_idx), %(limit)s pending ones (workflows' steps waiting for others,
#   eddyq_jobs_pending_idx), %(limit)s scheduled or retryable ones, the soonest due
#   (eddyq_jobs_due_idx), and %(sample)s of each terminal state, the latest finalized
#   (eddyq_jobs_finalized_idx): exact counts while a state has fewer, else its split by queue.
#   Each read follows its partial index in the index's order, which the ORDER BY asks for: with a
#   LIMIT and no order the planner may choose to scan the table until it finds enough rows, which
#   for a rare state is the whole table.
# - 'estimate': the planner's statistics of eddyq_jobs.state (pg_stats' most common values,
#   times pg_class.reltuples), from which a state past its bound is estimated: never a count(*)
#   of a large state.
# The caller runs it after METRICS_READ_SETTINGS, in the same transaction.
METRICS_GAUGES = f"""
WITH queues AS MATERIALIZED (
    SELECT name, paused_at IS NOT NULL AS paused FROM eddyq_queues
    ORDER BY name
    LIMIT %(queue_limit)s
), sampled AS (
    (SELECT queue, state FROM eddyq_jobs WHERE state = 'running'
     ORDER BY locked_until LIMIT %(limit)s)
    UNION ALL
    (SELECT queue, state FROM eddyq_jobs WHERE state = 'pending'
     ORDER BY id LIMIT %(limit)s)
    UNION ALL
    (SELECT queue, state FROM eddyq_jobs WHERE state IN ('scheduled', 'retryable')
     ORDER BY run_at LIMIT %(limit)s)
    UNION ALL
    (SELECT queue, state FROM eddyq_jobs WHERE state = 'completed'
     ORDER BY state, finalized_at DESC LIMIT %(sample)s)
    UNION ALL
    (SELECT queue, state FROM eddyq_jobs WHERE state = 'failed'
     ORDER BY state, finalized_at DESC LIMIT %(sample)s)
    UNION ALL
    (SELECT queue, state FROM eddyq_jobs WHERE state = 'cancelled'
     ORDER BY state, finalized_at DESC LIMIT %(sample)s)
)
SELECT 'queue' AS kind, queues.name AS queue, NULL::text AS state,
       queues.paused::integer::bigint AS jobs, NULL::float8 AS seconds
FROM queues
UNION ALL
SELECT 'latency', latency.queue, NULL, NULL, latency.seconds
FROM ({QUEUE_LATENCY}) AS latency(queue, seconds)
UNION ALL
SELECT 'available', queues.name, 'available',
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs AS job
                              WHERE job.state = 'available' AND job.limit_key IS NULL
                                AND job.queue = queues.name
                              LIMIT %(limit)s) AS counted)
       + (SELECT count(*) FROM (SELECT FROM eddyq_jobs AS job
                                WHERE job.state = 'available' AND job.limit_key IS NOT NULL
                                  AND job.queue = queues.name
                                LIMIT %(limit)s) AS keyed),
       NULL
FROM queues
UNION ALL
SELECT 'sampled', sampled.queue, sampled.state, count(*), NULL
FROM sampled
GROUP BY sampled.queue, sampled.state
UNION ALL
SELECT 'estimate', NULL, mcv.state, round(mcv.frequency * class.reltuples)::bigint, NULL
FROM pg_class AS class
JOIN pg_namespace AS namespace ON namespace.oid = class.relnamespace
JOIN pg_stats AS stats
  ON stats.schemaname = namespace.nspname AND stats.tablename = class.relname
 AND stats.attname = 'state'
CROSS JOIN LATERAL unnest(stats.most_common_vals::text::text[], stats.most_common_freqs)
    AS mcv(state, frequency)
WHERE class.oid = to_regclass('eddyq_jobs') AND class.reltuples > 0
"""

# Before METRICS_GAUGES, for its transaction only: a scrape never waits long on a lock (a
# statement_timeout), and is not JIT-compiled. The planner's costs of the reads past their
# LIMITs pass jit_above_cost, and compiling them took 40 ms of a 47 ms read at a million rows,
# where the read itself takes 7.
METRICS_READ_SETTINGS = """
SELECT set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('jit', 'off', true)
"""


# Activity: the counters of finished jobs per minute (written by FINISH_JOBS and RESCUE_JOBS),
# the sampled depth of each queue, and their reads (maintenance/activity.py, activity.py).
#
# Rows are keyed (minute, queue, source); minutes are truncated in UTC, so that an hour is the
# same hour in every session time zone. The primary key's index, minute first, serves every
# read and delete below by a range of minutes.

# Each queue's available jobs (of the first %(queue_limit)s queues by name), counted along
# eddyq_jobs_queue_claim_idx and eddyq_jobs_keyed_claim_idx up to %(limit)s, written as the
# sampler's row of the minute. Past the limit a queue's depth is an estimate, as the gauges make
# it: the planner's estimate of the available jobs (pg_stats' most common values times
# pg_class.reltuples) beyond those counted exactly, shared evenly by the queues past the limit,
# each at least %(limit)s + 1.
SAMPLE_QUEUE_DEPTH = """
WITH queues AS MATERIALIZED (
    SELECT name FROM eddyq_queues ORDER BY name LIMIT %(queue_limit)s
), counted AS MATERIALIZED (
    SELECT queues.name,
           LEAST(
               (SELECT count(*) FROM (SELECT FROM eddyq_jobs AS job
                                      WHERE job.state = 'available' AND job.limit_key IS NULL
                                        AND job.queue = queues.name
                                      LIMIT %(limit)s + 1) AS available)
               + (SELECT count(*) FROM (SELECT FROM eddyq_jobs AS job
                                        WHERE job.state = 'available'
                                          AND job.limit_key IS NOT NULL
                                          AND job.queue = queues.name
                                        LIMIT %(limit)s + 1) AS keyed),
               %(limit)s + 1
           ) AS available
    FROM queues
), estimate AS (
    SELECT round(mcv.frequency * class.reltuples)::bigint AS available
    FROM pg_class AS class
    JOIN pg_namespace AS namespace ON namespace.oid = class.relnamespace
    JOIN pg_stats AS stats
      ON stats.schemaname = namespace.nspname AND stats.tablename = class.relname
     AND stats.attname = 'state'
    CROSS JOIN LATERAL unnest(stats.most_common_vals::text::text[], stats.most_common_freqs)
        AS mcv(state, frequency)
    WHERE class.oid = to_regclass('eddyq_jobs') AND class.reltuples > 0
      AND mcv.state = 'available'
), share AS (
    SELECT GREATEST(
               COALESCE((SELECT max(available) FROM estimate), 0)
               - (SELECT COALESCE(sum(available), 0) FROM counted
                  WHERE available <= %(limit)s),
               0
           )::float8
           / NULLIF((SELECT count(*) FROM counted WHERE available > %(limit)s), 0) AS each
), sampled AS (
    INSERT INTO eddyq_activity AS activity (minute, queue, source, available)
    SELECT date_trunc('minute', COALESCE(%(now)s::timestamptz, now()), 'UTC'), counted.name,
           'sampler',
           CASE WHEN counted.available <= %(limit)s THEN counted.available
                ELSE GREATEST(round((SELECT each FROM share))::bigint, %(limit)s + 1)
           END
    FROM counted
    ON CONFLICT (minute, queue, source) DO UPDATE SET available = EXCLUDED.available
    RETURNING 1
)
SELECT count(*) FROM sampled
"""

# The rows of the oldest hour that ended before the last hour began, folded into one row per
# queue (source 'hour', minute the hour's start): its counts summed, its depth the highest
# sample. A pass folds an hour a statement, so that after a long stop no statement reads days of
# rows; the last hour's minutes, which the per-minute chart reads, stay as they are. A late row
# of an hour already folded (from a transaction that began over an hour earlier) is folded into
# it at the next pass; until then the reads sum it all the same.
FOLD_ACTIVITY_HOUR = """
WITH oldest AS (
    SELECT date_trunc('hour', min(minute), 'UTC') AS hour
    FROM eddyq_activity
    WHERE minute
          < date_trunc('hour', COALESCE(%(now)s::timestamptz, now()) - interval '1 hour', 'UTC')
      AND source <> 'hour'
), folded AS (
    DELETE FROM eddyq_activity AS activity
    USING oldest
    WHERE activity.minute >= oldest.hour
      AND activity.minute < oldest.hour + interval '1 hour'
      AND activity.source <> 'hour'
    RETURNING activity.*
), hourly AS (
    INSERT INTO eddyq_activity AS activity (
        minute, queue, source, completed, failed, retried, cancelled, snoozed, available
    )
    SELECT date_trunc('hour', minute, 'UTC'), queue, 'hour', sum(completed), sum(failed),
           sum(retried), sum(cancelled), sum(snoozed), max(available)
    FROM folded
    GROUP BY 1, 2
    ON CONFLICT (minute, queue, source) DO UPDATE
    SET completed = activity.completed + EXCLUDED.completed,
        failed = activity.failed + EXCLUDED.failed,
        retried = activity.retried + EXCLUDED.retried,
        cancelled = activity.cancelled + EXCLUDED.cancelled,
        snoozed = activity.snoozed + EXCLUDED.snoozed,
        available = GREATEST(activity.available, EXCLUDED.available)
)
SELECT count(*) FROM folded
"""

# Up to %(limit)s rows older than ACTIVITY_RETENTION (%(period)s), oldest first.
DELETE_OLD_ACTIVITY = """
WITH old AS (
    SELECT minute, queue, source FROM eddyq_activity
    WHERE minute
          < (COALESCE(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC' - %(period)s::interval)
            AT TIME ZONE 'UTC'
    ORDER BY minute
    LIMIT %(limit)s
), deleted AS (
    DELETE FROM eddyq_activity AS activity
    USING old
    WHERE (activity.minute, activity.queue, activity.source)
          = (old.minute, old.queue, old.source)
    RETURNING 1
)
SELECT count(*) FROM deleted
"""

# The activity of %(buckets)s buckets of a %(unit)s each, the last one the current one, of the
# queue %(queue)s (NULL: all queues): rows of (start, completed, failed, retried, cancelled,
# snoozed, available), every bucket there, its counts 0 when nothing was counted. available is
# the sum over queues of each queue's highest sample in the bucket, NULL when none was sampled.
ACTIVITY_SERIES = """
WITH buckets AS (
    SELECT generate_series(
               last - (%(buckets)s - 1) * %(step)s::interval, last, %(step)s::interval
           ) AS start
    FROM (SELECT date_trunc(%(unit)s, COALESCE(%(now)s::timestamptz, now()), 'UTC') AS last)
         AS now
), per_queue AS (
    SELECT date_trunc(%(unit)s, minute, 'UTC') AS start, queue, sum(completed) AS completed,
           sum(failed) AS failed, sum(retried) AS retried, sum(cancelled) AS cancelled,
           sum(snoozed) AS snoozed, max(available) AS available
    FROM eddyq_activity
    WHERE minute >= (SELECT min(start) FROM buckets)
      AND minute < (SELECT max(start) FROM buckets) + %(step)s::interval
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    GROUP BY 1, 2
)
SELECT buckets.start,
       COALESCE(sum(per_queue.completed), 0)::bigint, COALESCE(sum(per_queue.failed), 0)::bigint,
       COALESCE(sum(per_queue.retried), 0)::bigint, COALESCE(sum(per_queue.cancelled), 0)::bigint,
       COALESCE(sum(per_queue.snoozed), 0)::bigint, sum(per_queue.available)::bigint
FROM buckets
LEFT JOIN per_queue ON per_queue.start = buckets.start
GROUP BY buckets.start
ORDER BY buckets.start
"""

# Per queue, the jobs completed and failed in the current minute and the 1, 5 and 15 before it.
RECENT_ACTIVITY = """
WITH recent AS (
    SELECT activity.queue, activity.completed, activity.failed,
           now.minute - activity.minute AS age
    FROM eddyq_activity AS activity,
         (SELECT date_trunc('minute', COALESCE(%(now)s::timestamptz, now()), 'UTC') AS minute)
         AS now
    WHERE activity.minute >= now.minute - interval '15 minutes'
)
SELECT queue,
       COALESCE(sum(completed) FILTER (WHERE age <= interval '1 minute'), 0),
       COALESCE(sum(completed) FILTER (WHERE age <= interval '5 minutes'), 0),
       COALESCE(sum(completed), 0),
       COALESCE(sum(failed) FILTER (WHERE age <= interval '1 minute'), 0),
       COALESCE(sum(failed) FILTER (WHERE age <= interval '5 minutes'), 0),
       COALESCE(sum(failed), 0)
FROM recent
GROUP BY queue
ORDER BY queue
"""
