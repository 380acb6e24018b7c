-- SQLite's statements (see common.sql for the shared ones).

-- name: json_rows
-- The rows of one JSON document [[key, "payload's JSON text"], ...]. json_extract
-- turns a JSON scalar into an SQL value (a string loses its quotes, true becomes
-- 1), so each payload travels as a JSON string of its text, returned as is.
-- (The WHERE tells SQLite's parser that an ON CONFLICT clause follows.)
json_each(%s) AS u WHERE true

-- name: json_rows_key
json_extract(u.value, '$[0]')

-- name: json_rows_payload
json_extract(u.value, '$[1]')

-- name: update_conflicts
-- As PostgreSQL's. SQLite keeps JSON as text: payloads compare minified, and
-- enqueue writes every payload as encode_payload spells it, so that escapes
-- and key order match too.
ON CONFLICT ({queue}, {key}) DO UPDATE SET
    "payload" = excluded."payload",
    "kind" = excluded."kind",
    "priority" = excluded."priority",
    "max_attempts" = excluded."max_attempts",
    "scheduled_time" = excluded."scheduled_time",
    "updated_at" = excluded."updated_at",
    "next_attempt_time" = CASE WHEN {table}."status" = 'running'
        THEN {table}."next_attempt_time" ELSE excluded."next_attempt_time" END,
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
    OR json({table}."payload") IS NOT json(excluded."payload")
    OR {table}."kind" IS NOT excluded."kind"
    OR {table}."priority" IS NOT excluded."priority"
    OR {table}."max_attempts" IS NOT excluded."max_attempts"
    OR {table}."next_attempt_time" IS NOT excluded."next_attempt_time"

-- name: loaded_rows
-- The Spark loader's rows in a temporary table, one per key: the first
-- occurrence with ignore (min), the last with update (max).
temp.delayq_load AS src WHERE src.ord IN (SELECT {pick}(ord) FROM temp.delayq_load GROUP BY key) ORDER BY src.key

-- name: loaded_key
src.key

-- name: loaded_payload
src.payload

-- name: loaded_due
src.due

-- name: loaded_existing
-- How many of the loaded keys exist already (created vs updated: no xmax).
SELECT count(*) FROM {table} WHERE "queue" = ? AND "key" IN (SELECT key FROM temp.delayq_load)

-- name: archived_versions
-- The current version of some rows (SQLite compares them in Python: its
-- times are text). One IMMEDIATE transaction holds the write lock meanwhile.
SELECT id, status, attempt_count, updated_at, finished_at FROM {table} WHERE id IN (SELECT value FROM json_each(?))

-- name: delete_ids
-- Delete the rows whose archived version still matched.
DELETE FROM {table} WHERE id IN (SELECT value FROM json_each(?))
