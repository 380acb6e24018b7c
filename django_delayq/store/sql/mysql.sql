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
