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

-- name: json_rows_grouped
-- The rows of [[key, "payload's JSON text", group], ...], in the document's order.
json_each(%s) AS u WHERE true

-- name: json_rows_group
json_extract(u.value, '$[2]')

-- name: distinct
-- update_conflicts' comparison: true when the two values differ, NULLs included.
IS NOT

-- name: payload_distinct
-- SQLite keeps JSON as text: payloads compare minified, and enqueue writes
-- every payload as encode_payload spells it, so that escapes and key order
-- match too.
json({table}."payload") IS NOT json(excluded."payload")

-- name: loaded_rows
-- The Spark loader's rows in a temporary table, one per key: the first
-- occurrence with ignore (min), the last with update (max).
temp.delayq_load AS src WHERE src.ord IN (SELECT {pick}(ord) FROM temp.delayq_load GROUP BY key) ORDER BY src.key

-- name: loaded_rows_grouped
-- The same rows with their groups (grp, "" for none), written in the order they
-- were loaded (ord), not by key: their ids are their order within their group.
temp.delayq_load AS src WHERE src.ord IN (SELECT {pick}(ord) FROM temp.delayq_load GROUP BY key) ORDER BY src.ord

-- name: loaded_key
src.key

-- name: loaded_group
src.grp

-- name: loaded_keys
-- The keys in the loader's temporary table (what the hold-back looks at).
SELECT key FROM temp.delayq_load

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
