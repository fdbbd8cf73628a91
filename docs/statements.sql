-- Every statement django-eddyq sends, as PostgreSQL receives it: each constant of
-- django_eddyq/sql.py, and each variant that its functions and templates render, after a
-- comment naming it. Named parameters show as %(name)s, positional ones as %s: those of the
-- SQL that Django compiles into its own queries, and of the statements built around it.
-- The newlines around each statement are left out.
--
-- Written by tests/test_statements.py, which fails when this file is stale. Do not edit it:
-- change sql.py, then rewrite it with
--     EDDYQ_WRITE_STATEMENTS=1 .venv/bin/python -m pytest tests/test_statements.py

-- sql.LISTEN (channel sql.JOBS_CHANNEL)
LISTEN "eddyq_jobs"

-- sql.LISTEN (channel sql.SCHEDULED_CHANNEL)
LISTEN "eddyq_scheduled"

-- sql.LISTEN (channel sql.CONTROL_CHANNEL)
LISTEN "eddyq_control"

-- sql.LISTEN (channel sql.LEADER_CHANNEL)
LISTEN "eddyq_leader"

-- sql.INSERT_ONE_JOB
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

-- sql.INSERT_JOBS (no queue touch, no unique key)
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
), inserted AS (
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

-- sql.INSERT_JOBS (no queue touch, unique keys)
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
), inserted AS (
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
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
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

-- sql.INSERT_JOBS (queue rows touched, no unique key)
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
)
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
, inserted AS (
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

-- sql.INSERT_JOBS (queue rows touched, unique keys)
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
)
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
, inserted AS (
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
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
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

-- sql.RESERVE_JOB_IDS
SELECT now(), array(
    SELECT nextval('eddyq_jobs_id_seq') FROM generate_series(1, %(count)s)
)

-- sql.COPY_JOBS
COPY eddyq_jobs (
    id, task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at,
    errors, retention, metadata, batch_id
) FROM STDIN

-- sql.COPY_JOBS_RUN_AT_NOW
COPY eddyq_jobs (
    id, task, args, kwargs, queue, priority, state, attempt, max_attempts,
    errors, retention, metadata, batch_id
) FROM STDIN

-- sql.CREATE_AND_TOUCH_QUEUES
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

-- sql.NOTIFY_NEW_JOBS
SELECT count(pg_notify('eddyq_jobs', queue)) FROM unnest(%(available_queues)s::text[]) AS queue
UNION ALL
SELECT count(pg_notify('eddyq_scheduled', '')) WHERE %(scheduled)s

-- sql.RELEASE_UNIQUE_KEYS
UPDATE eddyq_jobs AS job SET unique_key = NULL
FROM unnest(%(unique_keys)s::text[], %(windows)s::float8[]) AS held(unique_key, window_seconds)
WHERE job.unique_key = held.unique_key
  AND (job.state IN ('failed', 'cancelled')
       OR (job.state = 'completed'
           AND (held.window_seconds IS NULL
                OR job.finalized_at <= now() - make_interval(secs => held.window_seconds))))

-- sql.TOUCH_QUEUES
UPDATE eddyq_queues SET updated_at = now()
WHERE name IN (
    SELECT name FROM eddyq_queues
    WHERE name = ANY(%(queues)s::text[]) AND updated_at < now() - interval '5 seconds'
    FOR UPDATE SKIP LOCKED
)

-- sql.CLAIM_WITHOUT_SORT
SELECT set_config('enable_sort', 'off', true)

-- sql.claim_statement (limit 1, any queue)
WITH picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL 
      AND queue NOT IN (SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL)
    ORDER BY priority DESC, run_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE eddyq_jobs AS job
SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
WHERE job.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING job.id, job.task, job.args, job.kwargs, job.queue, job.priority,
          extract(epoch FROM job.run_at)::float8, job.attempt, job.max_attempts, job.batch_id,
          job.metadata, extract(epoch FROM job.created_at)::float8

-- sql.claim_statement (limit 1, one queue)
WITH picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL AND queue = (%(queues)s::text[])[1]
      AND queue NOT IN (SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL)
    ORDER BY priority DESC, run_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE eddyq_jobs AS job
SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
WHERE job.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING job.id, job.task, job.args, job.kwargs, job.queue, job.priority,
          extract(epoch FROM job.run_at)::float8, job.attempt, job.max_attempts, job.batch_id,
          job.metadata, extract(epoch FROM job.created_at)::float8

-- sql.claim_statement (limit 1, several queues)
WITH picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL AND queue = ANY(%(queues)s::text[])
      AND queue NOT IN (SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL)
    ORDER BY priority DESC, run_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE eddyq_jobs AS job
SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
WHERE job.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING job.id, job.task, job.args, job.kwargs, job.queue, job.priority,
          extract(epoch FROM job.run_at)::float8, job.attempt, job.max_attempts, job.batch_id,
          job.metadata, extract(epoch FROM job.created_at)::float8

-- sql.claim_statement (limit 16, any queue)
WITH picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL 
      AND queue NOT IN (SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL)
    ORDER BY priority DESC, run_at, id
    LIMIT 16
    FOR UPDATE SKIP LOCKED
)
UPDATE eddyq_jobs AS job
SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
WHERE job.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING job.id, job.task, job.args, job.kwargs, job.queue, job.priority,
          extract(epoch FROM job.run_at)::float8, job.attempt, job.max_attempts, job.batch_id,
          job.metadata, extract(epoch FROM job.created_at)::float8

-- sql.claim_statement (limit 16, one queue)
WITH picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL AND queue = (%(queues)s::text[])[1]
      AND queue NOT IN (SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL)
    ORDER BY priority DESC, run_at, id
    LIMIT 16
    FOR UPDATE SKIP LOCKED
)
UPDATE eddyq_jobs AS job
SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
WHERE job.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING job.id, job.task, job.args, job.kwargs, job.queue, job.priority,
          extract(epoch FROM job.run_at)::float8, job.attempt, job.max_attempts, job.batch_id,
          job.metadata, extract(epoch FROM job.created_at)::float8

-- sql.claim_statement (limit 16, several queues)
WITH picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL AND queue = ANY(%(queues)s::text[])
      AND queue NOT IN (SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL)
    ORDER BY priority DESC, run_at, id
    LIMIT 16
    FOR UPDATE SKIP LOCKED
)
UPDATE eddyq_jobs AS job
SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
WHERE job.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING job.id, job.task, job.args, job.kwargs, job.queue, job.priority,
          extract(epoch FROM job.run_at)::float8, job.attempt, job.max_attempts, job.batch_id,
          job.metadata, extract(epoch FROM job.created_at)::float8

-- sql.LIMITED_QUEUES
SELECT name FROM eddyq_queues WHERE concurrency IS NOT NULL OR rate_limit IS NOT NULL

-- sql.LOCK_LIMITS
SELECT count(pg_advisory_xact_lock(1701078137, hashtext(name)))
FROM (SELECT DISTINCT unnest(%(limited)s::text[]) AS name ORDER BY name) AS limited

-- sql.LIMITED_CLAIM_WITHOUT_SORT
SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)

-- sql.LIMITED_CLAIM_GENERIC_PLANS
SELECT set_config('plan_cache_mode', 'force_generic_plan', true)

-- sql.limited_claim_statement (any queue)
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
)
, keyed_picked AS (
    SELECT NULL::bigint AS id WHERE false
), other_picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL 
      AND queue NOT IN (SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL)
    ORDER BY priority DESC, run_at, id
    LIMIT GREATEST(
        %(limit)s - (SELECT count(*) FROM limited_picked) - (SELECT count(*) FROM keyed_picked), 0
    )
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE eddyq_jobs AS job
    SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
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
           clock.at + make_interval(
               secs => (allowance.rate_burst - (allowance.tokens - taken.jobs))
                        * allowance.rate_period / allowance.rate_limit
           )
    FROM allowance
    CROSS JOIN clock
    JOIN (SELECT queue, count(*) AS jobs FROM claimed WHERE limit_key IS NULL GROUP BY queue)
      AS taken ON taken.queue = allowance.name
    WHERE allowance.tokens IS NOT NULL
    ON CONFLICT (name) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, full_at = EXCLUDED.full_at
)
SELECT id, task, args, kwargs, queue, priority, due, attempt, max_attempts, batch_id, metadata,
       created
FROM claimed

-- sql.limited_claim_statement (one queue)
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
)
, keyed_picked AS (
    SELECT NULL::bigint AS id WHERE false
), other_picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL AND queue = (%(queues)s::text[])[1]
      AND queue NOT IN (SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL)
    ORDER BY priority DESC, run_at, id
    LIMIT GREATEST(
        %(limit)s - (SELECT count(*) FROM limited_picked) - (SELECT count(*) FROM keyed_picked), 0
    )
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE eddyq_jobs AS job
    SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
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
           clock.at + make_interval(
               secs => (allowance.rate_burst - (allowance.tokens - taken.jobs))
                        * allowance.rate_period / allowance.rate_limit
           )
    FROM allowance
    CROSS JOIN clock
    JOIN (SELECT queue, count(*) AS jobs FROM claimed WHERE limit_key IS NULL GROUP BY queue)
      AS taken ON taken.queue = allowance.name
    WHERE allowance.tokens IS NOT NULL
    ON CONFLICT (name) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, full_at = EXCLUDED.full_at
)
SELECT id, task, args, kwargs, queue, priority, due, attempt, max_attempts, batch_id, metadata,
       created
FROM claimed

-- sql.limited_claim_statement (several queues)
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
)
, keyed_picked AS (
    SELECT NULL::bigint AS id WHERE false
), other_picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL AND queue = ANY(%(queues)s::text[])
      AND queue NOT IN (SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL)
    ORDER BY priority DESC, run_at, id
    LIMIT GREATEST(
        %(limit)s - (SELECT count(*) FROM limited_picked) - (SELECT count(*) FROM keyed_picked), 0
    )
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE eddyq_jobs AS job
    SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
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
           clock.at + make_interval(
               secs => (allowance.rate_burst - (allowance.tokens - taken.jobs))
                        * allowance.rate_period / allowance.rate_limit
           )
    FROM allowance
    CROSS JOIN clock
    JOIN (SELECT queue, count(*) AS jobs FROM claimed WHERE limit_key IS NULL GROUP BY queue)
      AS taken ON taken.queue = allowance.name
    WHERE allowance.tokens IS NOT NULL
    ON CONFLICT (name) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, full_at = EXCLUDED.full_at
)
SELECT id, task, args, kwargs, queue, priority, due, attempt, max_attempts, batch_id, metadata,
       created
FROM claimed

-- sql.limited_claim_statement (limited queues only)
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
)
, keyed_picked AS (
    SELECT NULL::bigint AS id WHERE false
), other_picked AS (
    SELECT NULL::bigint AS id WHERE false
), claimed AS (
    UPDATE eddyq_jobs AS job
    SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
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
           clock.at + make_interval(
               secs => (allowance.rate_burst - (allowance.tokens - taken.jobs))
                        * allowance.rate_period / allowance.rate_limit
           )
    FROM allowance
    CROSS JOIN clock
    JOIN (SELECT queue, count(*) AS jobs FROM claimed WHERE limit_key IS NULL GROUP BY queue)
      AS taken ON taken.queue = allowance.name
    WHERE allowance.tokens IS NOT NULL
    ON CONFLICT (name) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, full_at = EXCLUDED.full_at
)
SELECT id, task, args, kwargs, queue, priority, due, attempt, max_attempts, batch_id, metadata,
       created
FROM claimed

-- sql.lock_keys_statement (any queue)
WITH RECURSIVE clock AS MATERIALIZED (
    SELECT clock_timestamp() AS at
), task_limit AS MATERIALIZED (
    SELECT * FROM unnest(
        %(keyed_tasks)s::text[], %(key_concurrency)s::integer[], %(key_rate)s::integer[],
        %(key_period)s::float8[], %(key_burst)s::integer[]
    ) AS task_limit(task, concurrency, rate_limit, rate_period, rate_burst)
), key_running AS MATERIALIZED (
    SELECT task, limit_key, count(*) AS jobs FROM eddyq_jobs
    WHERE state = 'running' AND limit_key IS NOT NULL AND task = ANY(%(keyed_tasks)s::text[])
    GROUP BY task, limit_key
), key_window AS MATERIALIZED (
    SELECT queue, task, limit_key, id, priority, run_at,
           row_number() OVER (
               PARTITION BY task, limit_key ORDER BY priority DESC, run_at, id
           ) AS nth
    FROM (
        SELECT queue, task, limit_key, id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL 
          AND queue NOT IN (SELECT name FROM eddyq_queues WHERE paused_at IS NOT NULL)
        ORDER BY priority DESC, run_at, id
        LIMIT GREATEST(4 * %(limit)s, 32)
    ) AS job
    WHERE task IN (SELECT task FROM task_limit)
), window_room AS MATERIALIZED (
    SELECT head.queue, head.task, head.limit_key, head.id, head.priority, head.run_at,
           'task:' || head.task || ':' || head.limit_key AS name, refill.tokens,
           task_limit.rate_limit, task_limit.rate_period, task_limit.rate_burst,
           LEAST(
               %(limit)s,
               COALESCE(task_limit.concurrency - COALESCE(running.jobs, 0), %(limit)s),
               COALESCE(floor(refill.tokens), %(limit)s)
           )::integer AS allowed
    FROM (SELECT * FROM key_window WHERE nth = 1) AS head
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
    ) AS refill
), window_offer AS MATERIALIZED (
    SELECT job.id
    FROM key_window AS job
    JOIN window_room AS room ON room.task = job.task AND room.limit_key = job.limit_key
    WHERE job.nth <= room.allowed
), key_heads AS (
    SELECT first.* FROM (
        SELECT queue, task, limit_key, id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL
        ORDER BY queue, task, limit_key, priority DESC, run_at, id
        LIMIT 1
    ) AS first
    WHERE (SELECT count(*) FROM key_window) >= GREATEST(4 * %(limit)s, 32)
          AND (SELECT count(*) FROM window_offer) < %(limit)s
    UNION ALL
    SELECT next.* FROM key_heads AS previous
    CROSS JOIN LATERAL (
        SELECT queue, task, limit_key, id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL
          AND (queue, task, limit_key) > (previous.queue, previous.task, previous.limit_key)
        ORDER BY queue, task, limit_key, priority DESC, run_at, id
        LIMIT 1
    ) AS next
), walked AS MATERIALIZED (
    SELECT DISTINCT ON (head.task, head.limit_key) head.*
    FROM key_heads AS head
    WHERE head.task IN (SELECT task FROM task_limit)
      AND head.queue NOT IN (SELECT name FROM eddyq_queues WHERE paused_at IS NOT NULL)
      AND (head.task, head.limit_key) NOT IN (SELECT task, limit_key FROM key_window)
    ORDER BY head.task, head.limit_key, head.priority DESC, head.run_at, head.id
), walked_room AS MATERIALIZED (
    SELECT head.queue, head.task, head.limit_key, head.id, head.priority, head.run_at,
           'task:' || head.task || ':' || head.limit_key AS name, refill.tokens,
           task_limit.rate_limit, task_limit.rate_period, task_limit.rate_burst,
           LEAST(
               %(limit)s,
               COALESCE(task_limit.concurrency - COALESCE(running.jobs, 0), %(limit)s),
               COALESCE(floor(refill.tokens), %(limit)s)
           )::integer AS allowed
    FROM walked AS head
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
    ) AS refill
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

-- sql.limited_claim_statement (any queue, keyed)
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
)
, task_limit AS MATERIALIZED (
    SELECT * FROM unnest(
        %(keyed_tasks)s::text[], %(key_concurrency)s::integer[], %(key_rate)s::integer[],
        %(key_period)s::float8[], %(key_burst)s::integer[]
    ) AS task_limit(task, concurrency, rate_limit, rate_period, rate_burst)
), key_running AS MATERIALIZED (
    SELECT task, limit_key, count(*) AS jobs FROM eddyq_jobs
    WHERE state = 'running' AND limit_key IS NOT NULL AND task = ANY(%(keyed_tasks)s::text[])
    GROUP BY task, limit_key
), key_room AS MATERIALIZED (
    SELECT head.queue, head.task, head.limit_key, head.id, head.priority, head.run_at,
           'task:' || head.task || ':' || head.limit_key AS name, refill.tokens,
           task_limit.rate_limit, task_limit.rate_period, task_limit.rate_burst,
           LEAST(
               %(limit)s,
               COALESCE(task_limit.concurrency - COALESCE(running.jobs, 0), %(limit)s),
               COALESCE(floor(refill.tokens), %(limit)s)
           )::integer AS allowed
    FROM (
        SELECT locked.*, NULL::bigint AS id, NULL::smallint AS priority,
               NULL::timestamptz AS run_at
        FROM jsonb_to_recordset(COALESCE(current_setting('eddyq.claim_keys', true), '[]')::jsonb)
             AS locked(queue text, task text, limit_key text)
    ) AS head
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
    ) AS refill
), keyed AS (
    SELECT job.id, job.priority, job.run_at
    FROM key_room
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL AND queue = key_room.queue
              AND task = key_room.task AND limit_key = key_room.limit_key
              AND queue NOT IN (SELECT name FROM eddyq_queues WHERE paused_at IS NOT NULL)
        ORDER BY priority DESC, run_at, id
        LIMIT key_room.allowed
        FOR UPDATE SKIP LOCKED
    ) AS job
    WHERE key_room.allowed >= 1
), keyed_picked AS (
    SELECT id FROM keyed ORDER BY priority DESC, run_at, id
    LIMIT GREATEST(%(limit)s - (SELECT count(*) FROM limited_picked), 0)
), other_picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL 
      AND queue NOT IN (SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL)
    ORDER BY priority DESC, run_at, id
    LIMIT GREATEST(
        %(limit)s - (SELECT count(*) FROM limited_picked) - (SELECT count(*) FROM keyed_picked), 0
    )
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE eddyq_jobs AS job
    SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
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
           clock.at + make_interval(
               secs => (allowance.rate_burst - (allowance.tokens - taken.jobs))
                        * allowance.rate_period / allowance.rate_limit
           )
    FROM allowance
    CROSS JOIN clock
    JOIN (SELECT queue, count(*) AS jobs FROM claimed WHERE limit_key IS NULL GROUP BY queue)
      AS taken ON taken.queue = allowance.name
    WHERE allowance.tokens IS NOT NULL
    ON CONFLICT (name) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, full_at = EXCLUDED.full_at
), key_spent AS (
    INSERT INTO eddyq_rate_buckets AS bucket (name, tokens, refilled_at, full_at)
    SELECT allowance.name, allowance.tokens - taken.jobs, clock.at,
           clock.at + make_interval(
               secs => (allowance.rate_burst - (allowance.tokens - taken.jobs))
                        * allowance.rate_period / allowance.rate_limit
           )
    FROM key_room AS allowance
    CROSS JOIN clock
    JOIN (
        SELECT task, limit_key, count(*) AS jobs FROM claimed
        WHERE limit_key IS NOT NULL GROUP BY task, limit_key
    ) AS taken ON taken.task = allowance.task AND taken.limit_key = allowance.limit_key
    WHERE allowance.tokens IS NOT NULL
    ON CONFLICT (name) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, full_at = EXCLUDED.full_at
)
SELECT id, task, args, kwargs, queue, priority, due, attempt, max_attempts, batch_id, metadata,
       created
FROM claimed

-- sql.lock_keys_statement (given queues)
WITH RECURSIVE clock AS MATERIALIZED (
    SELECT clock_timestamp() AS at
), task_limit AS MATERIALIZED (
    SELECT * FROM unnest(
        %(keyed_tasks)s::text[], %(key_concurrency)s::integer[], %(key_rate)s::integer[],
        %(key_period)s::float8[], %(key_burst)s::integer[]
    ) AS task_limit(task, concurrency, rate_limit, rate_period, rate_burst)
), key_running AS MATERIALIZED (
    SELECT task, limit_key, count(*) AS jobs FROM eddyq_jobs
    WHERE state = 'running' AND limit_key IS NOT NULL AND task = ANY(%(keyed_tasks)s::text[])
    GROUP BY task, limit_key
), key_window AS MATERIALIZED (
    SELECT queue, task, limit_key, id, priority, run_at,
           row_number() OVER (
               PARTITION BY task, limit_key ORDER BY priority DESC, run_at, id
           ) AS nth
    FROM (
        SELECT queue, task, limit_key, id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL AND queue = ANY(%(queues)s::text[])
          AND queue NOT IN (SELECT name FROM eddyq_queues WHERE paused_at IS NOT NULL)
        ORDER BY priority DESC, run_at, id
        LIMIT GREATEST(4 * %(limit)s, 32)
    ) AS job
    WHERE task IN (SELECT task FROM task_limit)
), window_room AS MATERIALIZED (
    SELECT head.queue, head.task, head.limit_key, head.id, head.priority, head.run_at,
           'task:' || head.task || ':' || head.limit_key AS name, refill.tokens,
           task_limit.rate_limit, task_limit.rate_period, task_limit.rate_burst,
           LEAST(
               %(limit)s,
               COALESCE(task_limit.concurrency - COALESCE(running.jobs, 0), %(limit)s),
               COALESCE(floor(refill.tokens), %(limit)s)
           )::integer AS allowed
    FROM (SELECT * FROM key_window WHERE nth = 1) AS head
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
    ) AS refill
), window_offer AS MATERIALIZED (
    SELECT job.id
    FROM key_window AS job
    JOIN window_room AS room ON room.task = job.task AND room.limit_key = job.limit_key
    WHERE job.nth <= room.allowed
), key_heads AS (
    SELECT first.* FROM unnest(%(queues)s::text[]) AS served(queue)
    CROSS JOIN LATERAL (
        SELECT queue, task, limit_key, id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL AND queue = served.queue
        ORDER BY queue, task, limit_key, priority DESC, run_at, id
        LIMIT 1
    ) AS first
    WHERE (SELECT count(*) FROM key_window) >= GREATEST(4 * %(limit)s, 32)
          AND (SELECT count(*) FROM window_offer) < %(limit)s
    UNION ALL
    SELECT next.* FROM key_heads AS previous
    CROSS JOIN LATERAL (
        SELECT queue, task, limit_key, id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL AND queue = previous.queue
          AND (task, limit_key) > (previous.task, previous.limit_key)
        ORDER BY queue, task, limit_key, priority DESC, run_at, id
        LIMIT 1
    ) AS next
), walked AS MATERIALIZED (
    SELECT DISTINCT ON (head.task, head.limit_key) head.*
    FROM key_heads AS head
    WHERE head.task IN (SELECT task FROM task_limit)
      AND head.queue NOT IN (SELECT name FROM eddyq_queues WHERE paused_at IS NOT NULL)
      AND (head.task, head.limit_key) NOT IN (SELECT task, limit_key FROM key_window)
    ORDER BY head.task, head.limit_key, head.priority DESC, head.run_at, head.id
), walked_room AS MATERIALIZED (
    SELECT head.queue, head.task, head.limit_key, head.id, head.priority, head.run_at,
           'task:' || head.task || ':' || head.limit_key AS name, refill.tokens,
           task_limit.rate_limit, task_limit.rate_period, task_limit.rate_burst,
           LEAST(
               %(limit)s,
               COALESCE(task_limit.concurrency - COALESCE(running.jobs, 0), %(limit)s),
               COALESCE(floor(refill.tokens), %(limit)s)
           )::integer AS allowed
    FROM walked AS head
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
    ) AS refill
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

-- sql.limited_claim_statement (given queues, keyed)
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
)
, task_limit AS MATERIALIZED (
    SELECT * FROM unnest(
        %(keyed_tasks)s::text[], %(key_concurrency)s::integer[], %(key_rate)s::integer[],
        %(key_period)s::float8[], %(key_burst)s::integer[]
    ) AS task_limit(task, concurrency, rate_limit, rate_period, rate_burst)
), key_running AS MATERIALIZED (
    SELECT task, limit_key, count(*) AS jobs FROM eddyq_jobs
    WHERE state = 'running' AND limit_key IS NOT NULL AND task = ANY(%(keyed_tasks)s::text[])
    GROUP BY task, limit_key
), key_room AS MATERIALIZED (
    SELECT head.queue, head.task, head.limit_key, head.id, head.priority, head.run_at,
           'task:' || head.task || ':' || head.limit_key AS name, refill.tokens,
           task_limit.rate_limit, task_limit.rate_period, task_limit.rate_burst,
           LEAST(
               %(limit)s,
               COALESCE(task_limit.concurrency - COALESCE(running.jobs, 0), %(limit)s),
               COALESCE(floor(refill.tokens), %(limit)s)
           )::integer AS allowed
    FROM (
        SELECT locked.*, NULL::bigint AS id, NULL::smallint AS priority,
               NULL::timestamptz AS run_at
        FROM jsonb_to_recordset(COALESCE(current_setting('eddyq.claim_keys', true), '[]')::jsonb)
             AS locked(queue text, task text, limit_key text)
    ) AS head
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
    ) AS refill
), keyed AS (
    SELECT job.id, job.priority, job.run_at
    FROM key_room
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM eddyq_jobs
        WHERE state = 'available' AND limit_key IS NOT NULL AND queue = key_room.queue
              AND task = key_room.task AND limit_key = key_room.limit_key
              AND queue NOT IN (SELECT name FROM eddyq_queues WHERE paused_at IS NOT NULL)
        ORDER BY priority DESC, run_at, id
        LIMIT key_room.allowed
        FOR UPDATE SKIP LOCKED
    ) AS job
    WHERE key_room.allowed >= 1
), keyed_picked AS (
    SELECT id FROM keyed ORDER BY priority DESC, run_at, id
    LIMIT GREATEST(%(limit)s - (SELECT count(*) FROM limited_picked), 0)
), other_picked AS (
    SELECT id FROM eddyq_jobs
    WHERE state = 'available' AND limit_key IS NULL AND queue = ANY(%(queues)s::text[])
      AND queue NOT IN (SELECT name FROM eddyq_queues
                       WHERE paused_at IS NOT NULL
                          OR concurrency IS NOT NULL
                          OR rate_limit IS NOT NULL)
    ORDER BY priority DESC, run_at, id
    LIMIT GREATEST(
        %(limit)s - (SELECT count(*) FROM limited_picked) - (SELECT count(*) FROM keyed_picked), 0
    )
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE eddyq_jobs AS job
    SET state = 'running',
    attempt = LEAST(job.attempt, 2147483646) + 1,
    attempted_at = now(),
    attempted_by = %(worker_id)s,
    heartbeat_at = now(),
    locked_by = %(worker_id)s,
    locked_until = now() + make_interval(secs => %(lease_seconds)s)
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
           clock.at + make_interval(
               secs => (allowance.rate_burst - (allowance.tokens - taken.jobs))
                        * allowance.rate_period / allowance.rate_limit
           )
    FROM allowance
    CROSS JOIN clock
    JOIN (SELECT queue, count(*) AS jobs FROM claimed WHERE limit_key IS NULL GROUP BY queue)
      AS taken ON taken.queue = allowance.name
    WHERE allowance.tokens IS NOT NULL
    ON CONFLICT (name) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, full_at = EXCLUDED.full_at
), key_spent AS (
    INSERT INTO eddyq_rate_buckets AS bucket (name, tokens, refilled_at, full_at)
    SELECT allowance.name, allowance.tokens - taken.jobs, clock.at,
           clock.at + make_interval(
               secs => (allowance.rate_burst - (allowance.tokens - taken.jobs))
                        * allowance.rate_period / allowance.rate_limit
           )
    FROM key_room AS allowance
    CROSS JOIN clock
    JOIN (
        SELECT task, limit_key, count(*) AS jobs FROM claimed
        WHERE limit_key IS NOT NULL GROUP BY task, limit_key
    ) AS taken ON taken.task = allowance.task AND taken.limit_key = allowance.limit_key
    WHERE allowance.tokens IS NOT NULL
    ON CONFLICT (name) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, full_at = EXCLUDED.full_at
)
SELECT id, task, args, kwargs, queue, priority, due, attempt, max_attempts, batch_id, metadata,
       created
FROM claimed

-- sql.FINISH_JOBS
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
      AND job.attempt = outcome.attempt
    RETURNING job.id, job.state, job.queue, job.limit_key
), counted AS (
    INSERT INTO eddyq_activity AS activity (
        minute, queue, source, completed, failed, retried, cancelled, snoozed
    )
    SELECT date_trunc('minute', now(), 'UTC'), queue, %(worker_id)s, count(*) FILTER (WHERE state = 'completed'),
           count(*) FILTER (WHERE state = 'failed'),
           count(*) FILTER (WHERE state = 'retryable'),
           count(*) FILTER (WHERE state = 'cancelled'),
           count(*) FILTER (WHERE state = 'scheduled')
    FROM finished
    WHERE state <> 'available'
    GROUP BY queue
    ON CONFLICT (minute, queue, source) DO UPDATE
    SET completed = activity.completed + EXCLUDED.completed,
        failed = activity.failed + EXCLUDED.failed,
        retried = activity.retried + EXCLUDED.retried,
        cancelled = activity.cancelled + EXCLUDED.cancelled,
        snoozed = activity.snoozed + EXCLUDED.snoozed
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

-- sql.FINISH_ATOMIC_JOB
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
      AND job.attempt = outcome.attempt
      AND job.cancel_requested_at IS NULL
    RETURNING job.id, job.state, job.queue, job.limit_key
), counted AS (
    INSERT INTO eddyq_activity AS activity (
        minute, queue, source, completed, failed, retried, cancelled, snoozed
    )
    SELECT date_trunc('minute', now(), 'UTC'), queue, %(source)s, count(*) FILTER (WHERE state = 'completed'),
           count(*) FILTER (WHERE state = 'failed'),
           count(*) FILTER (WHERE state = 'retryable'),
           count(*) FILTER (WHERE state = 'cancelled'),
           count(*) FILTER (WHERE state = 'scheduled')
    FROM finished
    WHERE state <> 'available'
    GROUP BY queue
    ON CONFLICT (minute, queue, source) DO UPDATE
    SET completed = activity.completed + EXCLUDED.completed,
        failed = activity.failed + EXCLUDED.failed,
        retried = activity.retried + EXCLUDED.retried,
        cancelled = activity.cancelled + EXCLUDED.cancelled,
        snoozed = activity.snoozed + EXCLUDED.snoozed
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

-- sql.HEARTBEAT
UPDATE eddyq_jobs
SET heartbeat_at = now(), locked_until = now() + make_interval(secs => %(lease_seconds)s)
WHERE id = ANY(%(ids)s::bigint[]) AND (state = 'running') IS TRUE AND locked_by = %(worker_id)s
RETURNING id, cancel_requested_at IS NOT NULL

-- sql.HAND_BACK_STRAYS
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

-- sql.WORKER_SEEN
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

-- sql.WORKER_STOPPED
UPDATE eddyq_workers
SET stopped_at = now(), last_seen_at = now(), running = 0, leader = false
WHERE id = %(id)s

-- sql.PROMOTE_DUE_ANY_QUEUE
WITH due AS (
    SELECT id FROM eddyq_jobs
    WHERE state IN ('scheduled', 'retryable')
      AND run_at <= COALESCE(%(now)s::timestamptz, now())
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

-- sql.PROMOTE_DUE_FROM_QUEUES
WITH due AS (
    SELECT id FROM eddyq_jobs
    WHERE state IN ('scheduled', 'retryable')
      AND run_at <= COALESCE(%(now)s::timestamptz, now()) AND queue = ANY(%(queues)s::text[])
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

-- sql.SELECT_STUCK_JOBS
SELECT id, task, attempt, max_attempts, locked_by, locked_until::text,
       cancel_requested_at IS NOT NULL
FROM eddyq_jobs
WHERE state = 'running' AND locked_until < COALESCE(%(now)s::timestamptz, now())
ORDER BY locked_until
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- sql.RESCUE_JOBS
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
           'rescuer', count(*) FILTER (WHERE state = 'completed'),
           count(*) FILTER (WHERE state = 'failed'),
           count(*) FILTER (WHERE state = 'retryable'),
           count(*) FILTER (WHERE state = 'cancelled'),
           count(*) FILTER (WHERE state = 'scheduled')
    FROM rescued
    GROUP BY queue
    ON CONFLICT (minute, queue, source) DO UPDATE
    SET completed = activity.completed + EXCLUDED.completed,
        failed = activity.failed + EXCLUDED.failed,
        retried = activity.retried + EXCLUDED.retried,
        cancelled = activity.cancelled + EXCLUDED.cancelled,
        snoozed = activity.snoozed + EXCLUDED.snoozed
)
SELECT id, state, batch_id FROM rescued

-- sql.SET_ASIDE_STUCK_JOB
UPDATE eddyq_jobs
SET state = 'failed',
    errors = errors || jsonb_build_array(
        %(error)s::jsonb || jsonb_build_object('at', COALESCE(%(now)s::timestamptz, now()))),
    finalized_at = COALESCE(%(now)s::timestamptz, now()),
    locked_by = NULL,
    locked_until = NULL
WHERE id = %(id)s AND state = 'running' AND locked_until < COALESCE(%(now)s::timestamptz, now())
RETURNING batch_id

-- sql.NEXT_DUE_IN
SELECT extract(epoch FROM min(run_at) - COALESCE(%(now)s::timestamptz, now()))
FROM eddyq_jobs
WHERE state IN ('scheduled', 'retryable') AND run_at < 'infinity'

-- sql.DATABASE_NOW
SELECT now()

-- sql.LOCK_PERIODIC_SCHEDULE
SELECT last_run_at >= %(run_at)s, enabled FROM eddyq_periodic WHERE name = %(name)s FOR UPDATE

-- sql.START_PERIODIC_SCHEDULE
INSERT INTO eddyq_periodic (name, last_run_at, updated_at)
VALUES (%(name)s, %(run_at)s, now())
ON CONFLICT (name) DO NOTHING

-- sql.ADVANCE_PERIODIC_SCHEDULE
UPDATE eddyq_periodic SET last_run_at = %(run_at)s, last_job_id = %(job_id)s, updated_at = now()
WHERE name = %(name)s AND last_run_at < %(run_at)s

-- sql.SELECT_PERIODIC_SCHEDULES
SELECT name, CASE WHEN isfinite(last_run_at) THEN last_run_at END, enabled FROM eddyq_periodic

-- sql.FORGET_PERIODIC_SCHEDULES
DELETE FROM eddyq_periodic
WHERE name <> ALL(%(names)s::text[])
  AND updated_at < COALESCE(%(now)s::timestamptz, now()) - interval '1 day'

-- sql.LIST_PERIODIC_SCHEDULES
SELECT name, CASE WHEN isfinite(last_run_at) THEN last_run_at END, last_job_id, enabled
FROM eddyq_periodic
ORDER BY name
LIMIT %(limit)s

-- sql.SET_PERIODIC_ENABLED
INSERT INTO eddyq_periodic (name, last_run_at, enabled, updated_at)
VALUES (%(name)s, %(run_at)s, %(enabled)s, now())
ON CONFLICT (name) DO UPDATE
SET enabled = EXCLUDED.enabled,
    last_run_at = CASE WHEN EXCLUDED.enabled AND NOT eddyq_periodic.enabled
                       THEN GREATEST(eddyq_periodic.last_run_at, EXCLUDED.last_run_at)
                       ELSE eddyq_periodic.last_run_at END,
    updated_at = now()

-- sql.ENSURE_LEADER_ROW
INSERT INTO eddyq_leader (name, leader_id, elected_at, expires_at)
VALUES (%(name)s, '', now(), '-infinity')
ON CONFLICT (name) DO NOTHING

-- sql.CAMPAIGN_FOR_LEADER
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

-- sql.FENCE_TIMEOUTS
WITH prior AS MATERIALIZED (
    SELECT current_setting('statement_timeout') AS statement_timeout,
           current_setting('idle_in_transaction_session_timeout') AS idle_timeout
)
SELECT statement_timeout, idle_timeout,
       set_config('statement_timeout', %(statement_timeout)s, %(local)s),
       set_config('idle_in_transaction_session_timeout', %(idle_timeout)s, %(local)s)
FROM prior

-- sql.RESTORE_TIMEOUTS
SELECT set_config('statement_timeout', %(statement_timeout)s, false),
       set_config('idle_in_transaction_session_timeout', %(idle_timeout)s, false)

-- sql.SET_LOCAL_STATEMENT_TIMEOUT
SELECT set_config('statement_timeout', %(timeout)s, true)

-- sql.RESIGN_LEADER
WITH resigned AS (
    UPDATE eddyq_leader SET expires_at = now() - interval '1 millisecond'
    WHERE name = %(name)s AND leader_id = %(leader_id)s
    RETURNING name
)
SELECT count(pg_notify('eddyq_leader', name)) FROM resigned

-- sql.JOB_EXPIRED_BY_DEFAULT (completed, at now(): the overview and Job.objects, with its columns as Django compiles them)
state = 'completed' AND finalized_at <= ((now()) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND (retention IS NULL OR NOT retention ? 'completed')

-- sql.JOB_EXPIRED_BY_DEFAULT (completed, at sql.NOW_POSITIONAL: the cleaner)
state = 'completed' AND finalized_at <= ((COALESCE(%s::timestamptz, now())) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND (retention IS NULL OR NOT retention ? 'completed')

-- sql.JOB_EXPIRED_BY_OVERRIDE (completed, at now(): the overview and Job.objects, with its columns as Django compiles them)
state = 'completed' AND retention IS NOT NULL AND extract(epoch FROM (now()) - finalized_at) >= CASE WHEN jsonb_typeof(retention -> 'completed') = 'number' THEN (retention ->> 'completed')::numeric END

-- sql.JOB_EXPIRED_BY_OVERRIDE (completed, at sql.NOW_POSITIONAL: the cleaner)
state = 'completed' AND retention IS NOT NULL AND extract(epoch FROM (COALESCE(%s::timestamptz, now())) - finalized_at) >= CASE WHEN jsonb_typeof(retention -> 'completed') = 'number' THEN (retention ->> 'completed')::numeric END

-- sql.JOB_EXPIRED_BY_DEFAULT (failed, at now(): the overview and Job.objects, with its columns as Django compiles them)
state = 'failed' AND finalized_at <= ((now()) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND (retention IS NULL OR NOT retention ? 'failed')

-- sql.JOB_EXPIRED_BY_DEFAULT (failed, at sql.NOW_POSITIONAL: the cleaner)
state = 'failed' AND finalized_at <= ((COALESCE(%s::timestamptz, now())) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND (retention IS NULL OR NOT retention ? 'failed')

-- sql.JOB_EXPIRED_BY_OVERRIDE (failed, at now(): the overview and Job.objects, with its columns as Django compiles them)
state = 'failed' AND retention IS NOT NULL AND extract(epoch FROM (now()) - finalized_at) >= CASE WHEN jsonb_typeof(retention -> 'failed') = 'number' THEN (retention ->> 'failed')::numeric END

-- sql.JOB_EXPIRED_BY_OVERRIDE (failed, at sql.NOW_POSITIONAL: the cleaner)
state = 'failed' AND retention IS NOT NULL AND extract(epoch FROM (COALESCE(%s::timestamptz, now())) - finalized_at) >= CASE WHEN jsonb_typeof(retention -> 'failed') = 'number' THEN (retention ->> 'failed')::numeric END

-- sql.JOB_EXPIRED_BY_DEFAULT (cancelled, at now(): the overview and Job.objects, with its columns as Django compiles them)
state = 'cancelled' AND finalized_at <= ((now()) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND (retention IS NULL OR NOT retention ? 'cancelled')

-- sql.JOB_EXPIRED_BY_DEFAULT (cancelled, at sql.NOW_POSITIONAL: the cleaner)
state = 'cancelled' AND finalized_at <= ((COALESCE(%s::timestamptz, now())) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND (retention IS NULL OR NOT retention ? 'cancelled')

-- sql.JOB_EXPIRED_BY_OVERRIDE (cancelled, at now(): the overview and Job.objects, with its columns as Django compiles them)
state = 'cancelled' AND retention IS NOT NULL AND extract(epoch FROM (now()) - finalized_at) >= CASE WHEN jsonb_typeof(retention -> 'cancelled') = 'number' THEN (retention ->> 'cancelled')::numeric END

-- sql.JOB_EXPIRED_BY_OVERRIDE (cancelled, at sql.NOW_POSITIONAL: the cleaner)
state = 'cancelled' AND retention IS NOT NULL AND extract(epoch FROM (COALESCE(%s::timestamptz, now())) - finalized_at) >= CASE WHEN jsonb_typeof(retention -> 'cancelled') = 'number' THEN (retention ->> 'cancelled')::numeric END

-- sql.BATCH_EXPIRED
state = 'complete' AND finalized_at <= (COALESCE(%s::timestamptz, now()) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC'

-- sql.delete_expired_statement (eddyq_jobs, completed jobs on RETENTION, first batch)
WITH doomed AS (
    SELECT id FROM "eddyq_jobs"
    WHERE state = 'completed' AND finalized_at <= ((COALESCE(%s::timestamptz, now())) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND (retention IS NULL OR NOT retention ? 'completed')
    ORDER BY finalized_at
    LIMIT %s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM "eddyq_jobs" AS gone
    WHERE gone.id = ANY(ARRAY(SELECT id FROM doomed))
    RETURNING gone.finalized_at
)
SELECT count(*), max(finalized_at) FROM deleted

-- sql.delete_expired_statement (eddyq_jobs, completed jobs on RETENTION, later batch)
WITH doomed AS (
    SELECT id FROM "eddyq_jobs"
    WHERE state = 'completed' AND finalized_at <= ((COALESCE(%s::timestamptz, now())) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND (retention IS NULL OR NOT retention ? 'completed') AND finalized_at >= %s
    ORDER BY finalized_at
    LIMIT %s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM "eddyq_jobs" AS gone
    WHERE gone.id = ANY(ARRAY(SELECT id FROM doomed))
    RETURNING gone.finalized_at
)
SELECT count(*), max(finalized_at) FROM deleted

-- sql.delete_expired_statement (eddyq_batches, sql.BATCH_EXPIRED, first batch)
WITH doomed AS (
    SELECT id FROM "eddyq_batches"
    WHERE state = 'complete' AND finalized_at <= (COALESCE(%s::timestamptz, now()) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC'
    ORDER BY finalized_at
    LIMIT %s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM "eddyq_batches" AS gone
    WHERE gone.id = ANY(ARRAY(SELECT id FROM doomed))
    RETURNING gone.finalized_at
)
SELECT count(*), max(finalized_at) FROM deleted

-- sql.delete_expired_statement (eddyq_batches, sql.BATCH_EXPIRED, later batch)
WITH doomed AS (
    SELECT id FROM "eddyq_batches"
    WHERE state = 'complete' AND finalized_at <= (COALESCE(%s::timestamptz, now()) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND finalized_at >= %s
    ORDER BY finalized_at
    LIMIT %s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM "eddyq_batches" AS gone
    WHERE gone.id = ANY(ARRAY(SELECT id FROM doomed))
    RETURNING gone.finalized_at
)
SELECT count(*), max(finalized_at) FROM deleted

-- sql.DELETE_STALE_QUEUES
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

-- sql.DELETE_FORGOTTEN_WORKERS
DELETE FROM eddyq_workers
WHERE last_seen_at
      <= (COALESCE(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC' - %(period)s::interval)
         AT TIME ZONE 'UTC'

-- sql.DELETE_FULL_RATE_BUCKETS
DELETE FROM eddyq_rate_buckets WHERE full_at <= COALESCE(%(now)s::timestamptz, now())

-- sql.REINDEX_FIND_INDEX
SELECT index_namespace.nspname, index_class.relname
FROM pg_index AS ix
JOIN pg_class AS index_class ON index_class.oid = ix.indexrelid
JOIN pg_namespace AS index_namespace ON index_namespace.oid = index_class.relnamespace
WHERE ix.indexrelid = to_regclass(quote_ident(%(name)s))
  AND ix.indrelid = to_regclass('eddyq_jobs')

-- sql.REINDEX_UNKNOWN_INDEXES
SELECT given.name
FROM unnest(%(names)s::text[]) WITH ORDINALITY AS given(name, position)
WHERE to_regclass('eddyq_jobs') IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM pg_index AS ix
      WHERE ix.indexrelid = to_regclass(quote_ident(given.name))
        AND ix.indrelid = to_regclass('eddyq_jobs')
  )
ORDER BY given.position

-- sql.REINDEX_BUILDS_IN_PROGRESS
SELECT progress.pid, progress.command
FROM pg_stat_progress_create_index AS progress
WHERE progress.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND (progress.relid = to_regclass('eddyq_jobs') OR progress.relid IS NULL)
  AND progress.pid <> pg_backend_pid()
ORDER BY progress.pid

-- sql.REINDEX_LEFTOVERS
SELECT leftover_namespace.nspname, leftover.relname
FROM pg_index AS ix
JOIN pg_class AS leftover ON leftover.oid = ix.indexrelid
JOIN pg_namespace AS leftover_namespace ON leftover_namespace.oid = leftover.relnamespace
WHERE ix.indrelid = to_regclass('eddyq_jobs')
  AND NOT ix.indisvalid
  AND left(leftover.relname, length(%(name)s)) = %(name)s
  AND substr(leftover.relname, length(%(name)s) + 1) ~ '^_cc(new|old)[0-9]*$'
ORDER BY leftover.relname

-- sql.REINDEX_INDEX (index "public"."eddyq_jobs_claim_idx")
REINDEX INDEX CONCURRENTLY "public"."eddyq_jobs_claim_idx"

-- sql.DROP_LEFTOVER_INDEX (index "public"."eddyq_jobs_claim_idx_ccnew")
DROP INDEX CONCURRENTLY IF EXISTS "public"."eddyq_jobs_claim_idx_ccnew"

-- sql.SET_QUEUE_PAUSED
INSERT INTO eddyq_queues (name, paused_at, created_at, updated_at, metadata)
VALUES (%(name)s, CASE WHEN %(paused)s THEN now() END, now(), now(), '{}'::jsonb)
ON CONFLICT (name) DO UPDATE
SET paused_at = CASE WHEN %(paused)s THEN COALESCE(eddyq_queues.paused_at, now()) END,
    updated_at = now()
RETURNING name

-- sql.SET_QUEUE_LIMITS
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

-- sql.NOTIFY_QUEUE
SELECT pg_notify('eddyq_jobs', %(name)s)

-- sql.CANCEL_JOBS
WITH cancelled AS (
    UPDATE eddyq_jobs
    SET state = CASE WHEN state = 'running' THEN state ELSE 'cancelled' END,
        finalized_at = CASE WHEN state = 'running' THEN finalized_at ELSE now() END,
        cancel_requested_at = COALESCE(cancel_requested_at, now())
    WHERE id = ANY(%(ids)s::bigint[])
      AND state IN ('pending', 'scheduled', 'available', 'running', 'retryable') AND (state <> 'running' OR cancel_requested_at IS NULL)
    RETURNING id, task, state, batch_id
)
SELECT id, task, state, batch_id,
       (SELECT count(pg_notify('eddyq_control', 'cancel:' || id)) FROM cancelled
        WHERE state = 'running')
FROM cancelled

-- sql.RETRY_JOBS
WITH retried AS (
    UPDATE eddyq_jobs
    SET state = 'available',
        run_at = now(),
        finalized_at = NULL,
        result = NULL,
        cancel_requested_at = NULL,
        max_attempts = GREATEST(max_attempts, attempt + 1)
    WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('failed', 'cancelled', 'retryable', 'scheduled')
    RETURNING id, task, state, queue
)
SELECT id, task, state, (SELECT count(pg_notify('eddyq_jobs', queue))
            FROM (SELECT DISTINCT queue FROM retried) AS woken)
FROM retried

-- sql.DELETE_JOBS
DELETE FROM eddyq_jobs
WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('completed', 'failed', 'cancelled')
RETURNING id, task, state

-- sql.CANCELLABLE_JOBS
SELECT id, task, state FROM eddyq_jobs WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('pending', 'scheduled', 'available', 'running', 'retryable') AND (state <> 'running' OR cancel_requested_at IS NULL)

-- sql.RETRIABLE_JOBS
SELECT id, task, state FROM eddyq_jobs WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('failed', 'cancelled', 'retryable', 'scheduled')

-- sql.DELETABLE_JOBS
SELECT id, task, state FROM eddyq_jobs WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('completed', 'failed', 'cancelled')

-- sql.JOB_ID_RANGE
SELECT min(id), max(id) FROM eddyq_jobs

-- sql.JOB_STATE
SELECT state FROM eddyq_jobs WHERE id = %(id)s

-- sql.LOCK_PENDING_BATCHES
SELECT id FROM eddyq_batches
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
ORDER BY id
FOR UPDATE

-- sql.COMPLETE_BATCHES
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

-- sql.SEAL_BATCH
UPDATE eddyq_batches SET sealed = true WHERE id = %(id)s

-- sql.SET_BATCH_CALLBACK_JOB
UPDATE eddyq_batches SET callback_job = %(job_id)s WHERE id = %(id)s

-- sql.INSERT_WORKFLOW
WITH workflow AS (
    INSERT INTO eddyq_workflows (
        name, state, retention, steps, unfinished, failed, created_at
    )
    VALUES (%(name)s, 'running', %(retention)s, %(count)s, %(count)s, 0, now())
    RETURNING id
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
)
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
, inserted AS (
    INSERT INTO eddyq_jobs (
        id, task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
        errors, retention, metadata, limit_key
    )
    SELECT input.id, task, args, kwargs, queue, priority,
           CASE WHEN waiting > 0 THEN 'pending'
                WHEN due_at > now() THEN 'scheduled' ELSE 'available' END,
           0, max_attempts, due_at, now(), '[]'::jsonb,
           '{"completed": null, "failed": null, "cancelled": null}'::jsonb,
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

-- sql.ADD_WORKFLOW_STEPS
WITH workflow AS (
    UPDATE eddyq_workflows
    SET steps = steps + %(count)s, unfinished = unfinished + %(count)s
    WHERE id = %(workflow_id)s AND finalized_at IS NULL
    RETURNING id
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
)
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
, inserted AS (
    INSERT INTO eddyq_jobs (
        id, task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
        errors, retention, metadata, limit_key
    )
    SELECT input.id, task, args, kwargs, queue, priority,
           CASE WHEN waiting > 0 THEN 'pending'
                WHEN due_at > now() THEN 'scheduled' ELSE 'available' END,
           0, max_attempts, due_at, now(), '[]'::jsonb,
           '{"completed": null, "failed": null, "cancelled": null}'::jsonb,
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

-- sql.LOCK_UPSTREAM_STEPS
SELECT job_id, name, ended_state FROM eddyq_workflow_steps
WHERE workflow_id = %(workflow_id)s AND name = ANY(%(names)s::text[])
ORDER BY job_id
FOR SHARE

-- sql.END_STEPS
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

-- sql.CANCEL_DEPENDENTS
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

-- sql.RELEASE_DEPENDENTS
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

-- sql.WORKFLOW_PROGRESS
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

-- sql.REOPEN_STEPS
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

-- sql.LOCK_STEPS
SELECT job_id FROM eddyq_workflow_steps
WHERE ended_state IS NULL
  AND (job_id = ANY(%(ids)s::bigint[])
       OR job_id IN (SELECT downstream_id FROM eddyq_workflow_edges
                     WHERE upstream_id = ANY(%(ids)s::bigint[])))
ORDER BY job_id
FOR UPDATE

-- sql.RECOUNT_STEPS
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

-- sql.FAILED_UPSTREAMS
SELECT DISTINCT upstream.job_id
FROM eddyq_workflow_edges AS edge
JOIN eddyq_workflow_steps AS upstream ON upstream.job_id = edge.upstream_id
WHERE edge.downstream_id = ANY(%(ids)s::bigint[])
  AND NOT edge.ignore_failure
  AND upstream.ended_state IN ('failed', 'cancelled')

-- sql.UNFINISHED_STEPS
SELECT job_id FROM eddyq_workflow_steps
WHERE workflow_id = %(id)s AND ended_state IS NULL
ORDER BY job_id

-- sql.FAILED_STEPS
SELECT job_id FROM eddyq_workflow_steps
WHERE workflow_id = %(id)s AND ended_state IN ('failed', 'cancelled') AND cancelled_by IS NULL
ORDER BY job_id

-- sql.MARK_WORKFLOW_CANCELLED
UPDATE eddyq_workflows SET state = 'cancelled' WHERE id = %(id)s AND state <> 'completed'

-- sql.CURRENT_STEP
SELECT workflow_id, name FROM eddyq_workflow_steps WHERE job_id = %(job_id)s

-- sql.DEPENDENCY_RESULTS
SELECT upstream.name, job.state, job.result
FROM eddyq_workflow_edges AS edge
JOIN eddyq_workflow_steps AS upstream ON upstream.job_id = edge.upstream_id
JOIN eddyq_jobs AS job ON job.id = edge.upstream_id
WHERE edge.downstream_id = %(job_id)s
ORDER BY upstream.name

-- sql.STEP_RESULT
SELECT job.state, job.result
FROM eddyq_workflow_steps AS step
JOIN eddyq_jobs AS job ON job.id = step.job_id
WHERE step.workflow_id = %(workflow_id)s AND step.name = %(name)s

-- sql.DELETE_EXPIRED_WORKFLOWS
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

-- sql.WORKFLOW_EXPIRED
COALESCE(eddyq_workflows.finalized_at + make_interval(secs => eddyq_workflows.retention) <= now(), false)

-- sql.TABLE_ESTIMATE
SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%(table)s)

-- sql.STATE_STATISTICS
SELECT stats.most_common_vals::text::text[], stats.most_common_freqs, class.reltuples
FROM pg_class AS class
JOIN pg_namespace AS namespace ON namespace.oid = class.relnamespace
LEFT JOIN pg_stats AS stats
  ON stats.schemaname = namespace.nspname AND stats.tablename = class.relname
 AND stats.attname = 'state'
WHERE class.oid = to_regclass('eddyq_jobs')

-- sql.state_counts_statement (every terminal state with a RETENTION)
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
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE (state = 'completed' AND finalized_at <= ((now()) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND (retention IS NULL OR NOT retention ? 'completed')) OR (state = 'completed' AND retention IS NOT NULL AND extract(epoch FROM (now()) - finalized_at) >= CASE WHEN jsonb_typeof(retention -> 'completed') = 'number' THEN (retention ->> 'completed')::numeric END) LIMIT %s) AS job)
           AS completed_expired,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE (state = 'failed' AND finalized_at <= ((now()) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND (retention IS NULL OR NOT retention ? 'failed')) OR (state = 'failed' AND retention IS NOT NULL AND extract(epoch FROM (now()) - finalized_at) >= CASE WHEN jsonb_typeof(retention -> 'failed') = 'number' THEN (retention ->> 'failed')::numeric END) LIMIT %s) AS job)
           AS failed_expired,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs WHERE (state = 'cancelled' AND finalized_at <= ((now()) AT TIME ZONE 'UTC' - %s::interval) AT TIME ZONE 'UTC' AND (retention IS NULL OR NOT retention ? 'cancelled')) OR (state = 'cancelled' AND retention IS NOT NULL AND extract(epoch FROM (now()) - finalized_at) >= CASE WHEN jsonb_typeof(retention -> 'cancelled') = 'number' THEN (retention ->> 'cancelled')::numeric END) LIMIT %s) AS job)
           AS cancelled_expired,
       (SELECT count(*) FROM (SELECT FROM eddyq_jobs
                              WHERE state = 'running' AND locked_until < now()
                              LIMIT %s) AS job)
           AS stuck

-- sql.QUEUE_AVAILABLE_JOBS (annotating Django's query of queues)
SELECT (SELECT count(*) FROM (SELECT FROM eddyq_jobs AS job
                              WHERE job.state = 'available' AND job.limit_key IS NULL
                                AND job.queue = eddyq_queues.name
                              LIMIT %s) AS available)
       + (SELECT count(*) FROM (SELECT FROM eddyq_jobs AS job
                                WHERE job.state = 'available' AND job.limit_key IS NOT NULL
                                  AND job.queue = eddyq_queues.name
                                LIMIT %s) AS keyed)

-- sql.QUEUE_RUNNING_JOBS (annotating Django's query of queues)
SELECT count(*) FROM eddyq_jobs AS job
WHERE job.state = 'running' AND job.queue = eddyq_queues.name

-- sql.TASK_NAMES
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

-- sql.QUEUE_LATENCY
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

-- sql.METRICS_GAUGES
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
FROM (
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
) AS latency(queue, seconds)
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

-- sql.METRICS_READ_SETTINGS
SELECT set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('jit', 'off', true)

-- sql.SAMPLE_QUEUE_DEPTH
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

-- sql.FOLD_ACTIVITY_HOUR
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

-- sql.DELETE_OLD_ACTIVITY
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

-- sql.ACTIVITY_SERIES
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

-- sql.RECENT_ACTIVITY
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
