-- The statements shared by every database; a database's own file overrides
-- a name. Names in braces are quoted table and column names.

-- name: held_rows
-- The rows of some ids still running under one lock token: the compare-and-set of
-- every outcome. {ids} is one placeholder per id.
{pk} IN ({ids}) AND {lock_token} = %s AND {status} = 'running'

-- name: claim
-- Mark the picked rows claimed and return them, in one statement (its own
-- transaction in autocommit). {set} is Django's compiled SET clause,
-- {picked} the ORM's pick of the first due rows.
{set}, {lock_token} = %s WHERE {pk} IN ({picked}) RETURNING {columns}

-- name: claim_lanes
-- The pick over several queues (claim._pick): {lanes} are each queue's own
-- pick of its first due rows, locked, joined by UNION ALL; the first {limit}
-- of them in claim order ({order}) are claimed.
SELECT {pk} FROM ({lanes}) AS delayq_lanes ORDER BY {order} LIMIT {limit}

-- name: claim_lane
-- One queue's pick, a derived table (a locking SELECT cannot be a member of a
-- UNION itself, and SQLite takes no parentheses around one).
SELECT * FROM ({picked}) AS delayq_lane{number}

-- name: next_due
-- The earliest due time of the active rows (of some queues: {queues} is empty
-- or an IN condition), the idle worker's wake-up. NULL due times are left
-- out: a grouped message held back has none.
SELECT MIN({due}) FROM {table} WHERE {status} IN ('pending', 'running'){queues}

-- name: insert_rows
-- New messages from a source of rows: {values} are the source's per-row
-- expressions (key, payload, ...) beside one parameter per other column.
INSERT INTO {table} ({columns}) SELECT {values} FROM {source}

-- name: insert_values
-- One new message: {values} are a parameter per column.
INSERT INTO {table} ({columns}) VALUES ({values})

-- name: one_row_payload
-- A single message's payload, the JSON text of encode_payload.
%s

-- name: ignore_conflicts
-- An existing (queue, key) keeps its message: the new row is skipped.
ON CONFLICT ({queue}, {key}) DO NOTHING

-- name: update_conflicts
-- on_conflict="update": an existing key gets the new content and schedule
-- (a finished message runs again, from attempt 1), unless nothing differs.
-- A running message keeps its attempt (lock token and lease): the new
-- version waits (superseded_at) and is due at its scheduled time once that
-- attempt ends, so it never runs beside it. Its next_attempt_time becomes
-- the later of the lease and the new due time: it stays when the row may
-- next be claimed, so a lease that lapses (a killed worker) does not run the
-- new version before its time. A workflow step still waiting for its parents
-- (store/dependencies.py: a count of parents not ended, or a failed one under
-- "wait") stays without a due time: its parents release it, not an update.
-- {distinct} and {payload_distinct} are the database's own comparisons (the
-- fragments of the same names).
ON CONFLICT ({queue}, {key}) DO UPDATE SET
    "payload" = excluded."payload",
    "kind" = excluded."kind",
    "priority" = excluded."priority",
    "max_attempts" = excluded."max_attempts",
    "scheduled_time" = excluded."scheduled_time",
    "updated_at" = excluded."updated_at",
    "next_attempt_time" = CASE WHEN {table}."status" <> 'running'
            AND ({table}."parents_waiting" > 0
                OR ({table}."parents_failed" > 0 AND {table}."on_parent_failure" = 'wait'))
        THEN NULL
        WHEN {table}."status" <> 'running'
            OR excluded."next_attempt_time" > {table}."next_attempt_time"
        THEN excluded."next_attempt_time" ELSE {table}."next_attempt_time" END,
    "superseded_at" = CASE WHEN {table}."status" = 'running'
        THEN excluded."updated_at" ELSE NULL END,
    "attempt_count" = CASE WHEN {table}."status" IN ('succeeded', 'failed', 'cancelled')
        THEN 0 ELSE {table}."attempt_count" END,
    "last_error" = CASE WHEN {table}."status" IN ('succeeded', 'failed', 'cancelled')
        THEN '' ELSE {table}."last_error" END,
    "last_traceback" = CASE WHEN {table}."status" IN ('succeeded', 'failed', 'cancelled')
        THEN '' ELSE {table}."last_traceback" END,
    "finished_at" = NULL,
    "lock_token" = CASE WHEN {table}."status" = 'running' THEN {table}."lock_token" ELSE NULL END,
    "status" = CASE WHEN {table}."status" = 'running' THEN 'running' ELSE 'pending' END
WHERE {table}."status" <> 'pending'
    OR {payload_distinct}
    OR {table}."kind" {distinct} excluded."kind"
    OR {table}."priority" {distinct} excluded."priority"
    OR {table}."max_attempts" {distinct} excluded."max_attempts"
    OR {table}."next_attempt_time" {distinct} excluded."next_attempt_time"

-- name: distinct_values
-- Distinct values of an indexed column by a "loose index scan": each step reads
-- the next larger value off the index, so listing the 5 queues of a table of a
-- million messages reads about 5 index entries instead of every row.
-- (PostgreSQL before 18 has no skip scan; SQLite plans it the same way.)
WITH RECURSIVE v(x) AS (
    SELECT (SELECT {col} FROM {table} WHERE {where} ORDER BY {col} LIMIT 1)
    UNION ALL
    SELECT (SELECT {col} FROM {table} WHERE {where} AND {col} > v.x ORDER BY {col} LIMIT 1)
    FROM v WHERE v.x IS NOT NULL
)
SELECT x FROM v WHERE x IS NOT NULL LIMIT %s

-- name: read_shared
-- Read rows with a shared lock (under REPEATABLE READ, only a locking read sees
-- rows committed since the snapshot). {select} is Django's SELECT, compiled
-- for the connection it runs on. Only databases without RETURNING use it
-- (MariaDB/MySQL, whose syntax this is).
{select} LOCK IN SHARE MODE
