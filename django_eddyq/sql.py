"""Every SQL statement the queue runs, kept together.

Statements are parameterised; the only text spliced in is fixed fragments chosen below, never
input. Times come from the database clock (``now()``) unless a caller injects ``now`` — workers on
many machines disagree about time, the database does not.
"""

from __future__ import annotations

# Channels for LISTEN/NOTIFY. NOTIFY is transactional: listeners hear only committed work.
JOBS_CHANNEL = "eddyq_jobs"  # payload: a queue name that has new available jobs

# The database's clock unless a test or an operator injects one.
NOW = "COALESCE(%(now)s::timestamptz, now())"

_NOTIFY_QUEUES = f"""
    SELECT count(pg_notify('{JOBS_CHANNEL}', queue))
    FROM (SELECT DISTINCT queue FROM {{source}} WHERE state = 'available') AS woken
"""

INSERT_JOBS = f"""
WITH input AS (
    SELECT *, COALESCE(given_run_at, now() + make_interval(secs => delay)) AS due_at
    FROM unnest(
        %(tasks)s::text[], %(args)s::jsonb[], %(kwargs)s::jsonb[], %(queues)s::text[],
        %(priorities)s::smallint[], %(max_attempts)s::integer[], %(run_ats)s::timestamptz[],
        %(delays)s::float8[], %(retentions)s::jsonb[], %(metadatas)s::jsonb[],
        %(batch_ids)s::bigint[]
    ) WITH ORDINALITY AS input(
        task, args, kwargs, queue, priority, max_attempts, given_run_at, delay, retention,
        metadata, batch_id, position
    )
), inserted AS (
    INSERT INTO eddyq_jobs (
        task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
        errors, retention, metadata, batch_id
    )
    SELECT task, args, kwargs, queue, priority,
           CASE WHEN due_at > now() THEN 'scheduled' ELSE 'available' END,
           0, max_attempts, due_at, now(), '[]'::jsonb, retention, metadata, batch_id
    FROM input
    ORDER BY position
    RETURNING id, state, run_at, created_at, queue
)
SELECT id, state, run_at, created_at, ({_NOTIFY_QUEUES.format(source="inserted")})
FROM inserted
ORDER BY id
"""

_CLAIM = """
WITH picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' {queue_filter}
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE eddyq_jobs AS job
SET state = 'running',
    attempt = job.attempt + 1,
    attempted_at = now(),
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
FROM picked
WHERE job.id = picked.id
RETURNING job.id, job.task, job.args, job.kwargs, job.queue, job.priority, job.run_at,
          job.attempt, job.max_attempts, job.attempted_at, job.batch_id, job.metadata
"""
CLAIM_ANY_QUEUE = _CLAIM.format(queue_filter="")
CLAIM_FROM_QUEUES = _CLAIM.format(queue_filter="AND queue = ANY(%(queues)s::text[])")

# Ends attempts, one statement per batch of finished jobs. Fenced: only a job still running
# under this worker and this attempt changes, so a late finish never overwrites a rescue.
FINISH_JOBS = f"""
WITH outcome AS (
    SELECT * FROM unnest(
        %(ids)s::bigint[], %(attempts)s::integer[], %(states)s::text[], %(results)s::jsonb[],
        %(errors)s::jsonb[], %(delays)s::float8[], %(attempts_given_back)s::integer[]
    ) AS outcome(id, attempt, state, result, error, delay, attempt_given_back)
), finished AS (
    UPDATE eddyq_jobs AS job
    SET state = outcome.state,
        attempt = job.attempt - outcome.attempt_given_back,
        result = outcome.result,
        errors = CASE WHEN outcome.error IS NULL THEN job.errors
                      ELSE job.errors || jsonb_build_array(
                          outcome.error || jsonb_build_object('at', now()))
                 END,
        run_at = CASE WHEN outcome.delay IS NULL THEN job.run_at
                      ELSE now() + make_interval(secs => outcome.delay)
                 END,
        finalized_at = CASE WHEN outcome.state IN ('completed', 'failed', 'cancelled')
                            THEN now() END,
        locked_by = NULL,
        locked_until = NULL
    FROM outcome
    WHERE job.id = outcome.id
      AND job.state = 'running'
      AND job.locked_by = %(worker_id)s
      AND job.attempt = outcome.attempt
    RETURNING job.id, job.state, job.queue
)
SELECT id, state, ({_NOTIFY_QUEUES.format(source="finished")}) FROM finished
"""

# One statement renews the lease of every job this worker runs; jobs not returned are no
# longer this worker's (rescued or finished elsewhere).
HEARTBEAT = """
UPDATE eddyq_jobs
SET heartbeat_at = now(), locked_until = now() + make_interval(secs => %(lease_seconds)s)
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'running' AND locked_by = %(worker_id)s
RETURNING id
"""

_PROMOTE_DUE = f"""
WITH due AS (
    SELECT id FROM eddyq_jobs
    WHERE state IN ('scheduled', 'retryable') AND run_at <= {NOW} {{queue_filter}}
    ORDER BY run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE eddyq_jobs AS job SET state = 'available'
    FROM due WHERE job.id = due.id
    RETURNING job.queue, job.state
)
SELECT count(*), ({_NOTIFY_QUEUES.format(source="promoted")}) FROM promoted
"""
PROMOTE_DUE_ANY_QUEUE = _PROMOTE_DUE.format(queue_filter="")
PROMOTE_DUE_FROM_QUEUES = _PROMOTE_DUE.format(queue_filter="AND queue = ANY(%(queues)s::text[])")
