-- MariaDB's and MySQL's statements (see common.sql for the shared ones).

-- name: insert_rows
-- New messages; IGNORE only has duplicate keys to skip (every other value
-- was validated before the first statement).
INSERT IGNORE INTO {table} ({columns}) SELECT {values} FROM {source}

-- name: json_rows
-- The rows of one JSON document [[key, "payload's JSON text"], ...]; the key
-- compares byte-wise, as the column's collation must (check W050).
JSON_TABLE(%s, '$[*]' COLUMNS (
    k VARCHAR({key_length}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
    p LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]')) AS u

-- name: json_rows_key
u.k

-- name: json_rows_payload
u.p

-- name: json_rows_grouped
-- The rows of [[key, "payload's JSON text", group], ...], in the document's order.
JSON_TABLE(%s, '$[*]' COLUMNS (
    k VARCHAR({key_length}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
    p LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]',
    g VARCHAR({group_length}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[2]')) AS u

-- name: json_rows_group
u.g

-- name: column_collations
-- The collation of the queue table's queue, key and group columns.
SELECT column_name, collation_name FROM information_schema.columns
WHERE table_schema = DATABASE() AND table_name = %s
AND column_name IN ('queue', 'key', 'message_group')

-- name: binary_columns
-- Give queue, key and group a byte-wise collation without padding: 'a', 'A'
-- and 'a ' are three keys (and three groups).
ALTER TABLE {table} MODIFY {queue} varchar({queue_length}) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL, MODIFY {key} varchar({key_length}) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL, MODIFY {group} varchar({group_length}) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL DEFAULT ''

-- name: row_estimate
-- InnoDB's own estimate (sampled index pages, refreshed as the table changes).
SELECT table_rows FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = %s

-- name: loaded_table
-- The Spark loader's temporary table (one per executor connection): keys and
-- groups in the columns' exact collation, so that "a", "A" and "a " stay
-- three rows, as they are three messages.
CREATE TEMPORARY TABLE IF NOT EXISTS delayq_load (
    ord BIGINT NOT NULL,
    `key` VARCHAR({key_length}) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL,
    payload LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    due DATETIME(6) NOT NULL,
    grp VARCHAR({group_length}) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL DEFAULT '')

-- name: loaded_rows
-- The loader's rows, one per key: the first occurrence with ignore, the last
-- with update. ROW_NUMBER reads the temporary table once (MySQL cannot open
-- a temporary table twice in one statement).
(SELECT `key`, payload, due, ROW_NUMBER() OVER (PARTITION BY `key` ORDER BY ord {order}) AS n FROM delayq_load) AS src WHERE src.n = 1 ORDER BY src.`key`

-- name: loaded_rows_grouped
-- The same rows with their groups (grp, "" for none), written in the order they
-- were loaded (ord), not by key: their ids are their order within their group.
(SELECT `key`, payload, due, grp, ord, ROW_NUMBER() OVER (PARTITION BY `key` ORDER BY ord {order}) AS n FROM delayq_load) AS src WHERE src.n = 1 ORDER BY src.ord

-- name: loaded_key
src.`key`

-- name: loaded_group
src.grp

-- name: loaded_keys
-- The keys in the loader's temporary table (what the hold-back looks at).
SELECT `key` FROM delayq_load

-- name: loaded_payload
src.payload

-- name: loaded_due
src.due

-- name: loaded_changed
-- Whether an existing message differs from the loaded version (the WHERE of
-- common.sql's update_conflicts): payloads compare as their normalised JSON
-- text, and every text byte-wise, whatever the columns' collation.
({table}.`status` <> 'pending'
    OR CAST(JSON_EXTRACT({table}.`payload`, '$') AS BINARY) <> CAST(JSON_EXTRACT(VALUES(`payload`), '$') AS BINARY)
    OR NOT (CAST({table}.`kind` AS BINARY) <=> CAST(VALUES(`kind`) AS BINARY))
    OR NOT ({table}.`priority` <=> VALUES(`priority`))
    OR NOT ({table}.`max_attempts` <=> VALUES(`max_attempts`))
    OR NOT ({table}.`next_attempt_time` <=> VALUES(`next_attempt_time`)))

-- name: duplicate_key_update
-- on_conflict="update" for the loader: what common.sql's update_conflicts
-- writes over an existing key, as ON DUPLICATE KEY UPDATE, which has no WHERE:
-- each column keeps its value unless {changed}. MySQL assigns left to right,
-- each assignment seeing the ones before (MariaDB too, unless its
-- SIMULTANEOUS_ASSIGNMENT mode is on): the columns {changed} reads come last,
-- status the very last, so it means the same under either order. A row left
-- alone counts 0 affected rows, an updated one 2. A running row's due time
-- becomes the later of its lease and the new version's, and a step waiting for
-- its parents keeps no due time, as in update_conflicts.
-- Every column is qualified: the source has columns of the same names.
ON DUPLICATE KEY UPDATE
    {table}.`scheduled_time` = IF({changed}, VALUES(`scheduled_time`), {table}.`scheduled_time`),
    {table}.`updated_at` = IF({changed}, VALUES(`updated_at`), {table}.`updated_at`),
    {table}.`superseded_at` = IF({changed}, IF({table}.`status` = 'running', VALUES(`updated_at`), NULL), {table}.`superseded_at`),
    {table}.`attempt_count` = IF({changed} AND {table}.`status` IN ('succeeded', 'failed', 'cancelled'), 0, {table}.`attempt_count`),
    {table}.`last_error` = IF({changed} AND {table}.`status` IN ('succeeded', 'failed', 'cancelled'), '', {table}.`last_error`),
    {table}.`last_traceback` = IF({changed} AND {table}.`status` IN ('succeeded', 'failed', 'cancelled'), '', {table}.`last_traceback`),
    {table}.`finished_at` = IF({changed}, NULL, {table}.`finished_at`),
    {table}.`lock_token` = IF({changed} AND {table}.`status` <> 'running', NULL, {table}.`lock_token`),
    {table}.`payload` = IF({changed}, VALUES(`payload`), {table}.`payload`),
    {table}.`kind` = IF({changed}, VALUES(`kind`), {table}.`kind`),
    {table}.`priority` = IF({changed}, VALUES(`priority`), {table}.`priority`),
    {table}.`max_attempts` = IF({changed}, VALUES(`max_attempts`), {table}.`max_attempts`),
    {table}.`next_attempt_time` = IF({changed} AND {table}.`status` <> 'running' AND ({table}.`parents_waiting` > 0 OR ({table}.`parents_failed` > 0 AND {table}.`on_parent_failure` = 'wait')), NULL, IF({changed} AND ({table}.`status` <> 'running' OR VALUES(`next_attempt_time`) > {table}.`next_attempt_time`), VALUES(`next_attempt_time`), {table}.`next_attempt_time`)),
    {table}.`status` = IF({changed} AND {table}.`status` <> 'running', 'pending', {table}.`status`)

-- name: archived_versions
-- The current version of some rows, locked until the delete commits (compared
-- in Python, like SQLite's); the ids as one JSON array. Joined, not IN
-- (subquery): the rows are found by primary key, so only they are locked.
SELECT t.id, t.status, t.attempt_count, t.updated_at, t.finished_at FROM JSON_TABLE(%s, '$[*]' COLUMNS (id BIGINT PATH '$')) AS j JOIN {table} AS t ON t.id = j.id FOR UPDATE

-- name: delete_ids
-- Delete the rows whose archived version still matched. A multi-table DELETE:
-- MariaDB runs a single-table DELETE ... WHERE id IN (subquery) as a scan of
-- the whole table, waiting for every row another transaction holds.
DELETE t FROM {table} AS t JOIN JSON_TABLE(%s, '$[*]' COLUMNS (id BIGINT PATH '$')) AS j ON t.id = j.id

-- name: no_wait_mariadb
-- One statement that fails at once (error 1205) rather than wait for a row
-- lock another transaction holds: the worker's own writes to rows it holds
-- never queue behind a producer's long transaction (it tries again later).
SET STATEMENT innodb_lock_wait_timeout = 0 FOR {sql}

-- name: no_wait_mysql
-- MySQL's form of the same: the lock wait timeout as an optimizer hint
-- (one second, the shortest it takes) right after the statement's verb.
{verb} /*+ SET_VAR(innodb_lock_wait_timeout = 1) */ {rest}
