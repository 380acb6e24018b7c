-- PostgreSQL's statements (see common.sql for the shared ones).

-- name: held_rows
-- The rows of some ids still running under one lock token, the ids as one array.
{pk} = ANY(%s) AND {lock_token} = %s AND {status} = 'running'

-- name: held_rows_unlocked
-- The same rows, less those another transaction has locked: the worker's
-- housekeeping (lease extensions, releases) never waits for a lock.
{pk} IN (SELECT {pk} FROM {table} WHERE {pk} = ANY(%s) AND {lock_token} = %s AND {status} = 'running' FOR UPDATE SKIP LOCKED)

-- name: held_pairs
-- The rows of several claims still running, each under its own lock token: an
-- UPDATE's FROM and WHERE, the ids and their tokens as two arrays of one length.
-- RETURNING names the pair that matched (the new row has no token any more).
FROM unnest(%s, %s) AS held(held_pk, held_token) WHERE {pk} = held.held_pk AND {lock_token} = held.held_token AND {status} = 'running' RETURNING held.held_pk, held.held_token

-- name: held_pairs_unlocked
-- held_pairs, less the rows another transaction has locked: a batch of
-- acknowledgements never waits behind a producer's lock on one of its rows
-- (the acknowledgement thread tries that one again later).
FROM (SELECT m.{pk} AS held_pk, held.held_token FROM unnest(%s, %s) AS held(held_pk, held_token) JOIN {table} m ON m.{pk} = held.held_pk AND m.{lock_token} = held.held_token AND m.{status} = 'running' FOR UPDATE OF m SKIP LOCKED) AS held WHERE {pk} = held.held_pk RETURNING held.held_pk, held.held_token

-- name: json_rows
-- The rows of one JSON document [[key, payload], ...]: one parameter, any size.
jsonb_array_elements(%s::jsonb) AS u(value)

-- name: json_rows_key
u.value->>0

-- name: json_rows_payload
u.value->1

-- name: one_row_payload
-- A single message's payload, the JSON text of encode_payload.
%s::jsonb

-- name: json_rows_grouped
-- The rows of [[key, payload, group], ...], in the document's order.
jsonb_array_elements(%s::jsonb) AS u(value)

-- name: json_rows_group
u.value->>2

-- name: distinct
-- update_conflicts' comparison: true when the two values differ, NULLs included.
IS DISTINCT FROM

-- name: payload_distinct
-- Whether the stored payload differs from the new one: compared as jsonb's
-- text (keys in jsonb's order), since jsonb equality calls 1 and 1.0 equal
-- and the new payload's 1.0 would be dropped.
{table}."payload"::text IS DISTINCT FROM excluded."payload"::text

-- name: inserted
-- Whether an upserted row was inserted (not updated): a new row version has no xmax.
(xmax = 0)

-- name: with_notify
-- The insert, and a wake-up for idle workers if it created a row: pg_notify runs
-- once (a materialised CTE) and, like any NOTIFY, is delivered on commit.
WITH ins AS ({insert}), wake AS MATERIALIZED (SELECT pg_notify(%s, %s) WHERE EXISTS (SELECT 1 FROM ins))
SELECT ins.* FROM ins LEFT JOIN wake ON true

-- name: notify
-- Wake idle workers (LISTEN); delivered when the transaction commits.
SELECT pg_notify(%s, %s)

-- name: claim
-- The claim (common.sql's), committed without waiting for the write-ahead log
-- to reach the disk: synchronous_commit is off for its own transaction only
-- (set_config's is_local; through a transaction-mode pooler too). Under other
-- writers that wait was most of an idle worker's pickup (claim 3.2 -> 1.6 ms).
-- What a server crash can lose is the claim alone: its message is pending
-- again and claimed anew, as after a lost lease. An outcome never depends on
-- a lost claim: the log is flushed in order, so the acknowledgement's
-- synchronous commit (and an atomic handler's writes with it) flushes the
-- claim before it.
{set}, {lock_token} = %s WHERE {pk} IN ({picked}) AND set_config('synchronous_commit', 'off', true) IS NOT NULL RETURNING {columns}

-- name: row_estimate
-- The planner's estimate of the table's rows (kept by autovacuum and ANALYZE).
SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)

-- name: loaded_rows
-- The Spark loader's rows (a partition's batch, COPYed into a temporary table),
-- one per key: the first occurrence with ignore, the last with update
-- (ON CONFLICT DO UPDATE may not touch a row twice in one statement).
(SELECT DISTINCT ON (key) key, payload, due FROM pg_temp.delayq_load ORDER BY key, ord {order}) AS src

-- name: loaded_rows_grouped
-- The same rows with their groups (grp, "" for none), written in the order they
-- were loaded (ord), not by key: their ids are their order within their group.
(SELECT DISTINCT ON (key) key, payload, due, grp, ord FROM pg_temp.delayq_load ORDER BY key, ord {order}) AS src ORDER BY src.ord

-- name: loaded_key
src.key

-- name: loaded_group
src.grp

-- name: loaded_keys
-- The keys in the loader's temporary table (what the hold-back looks at).
SELECT key FROM pg_temp.delayq_load

-- name: loaded_payload
src.payload::jsonb

-- name: loaded_due
src.due::timestamptz

-- name: load_counts
-- The loader's insert, and what it did: created and updated rows, and the
-- earliest due time among them (for one NOTIFY per transaction).
WITH ins AS ({insert} RETURNING (xmax = 0) AS created, "next_attempt_time" AS due)
SELECT count(*) FILTER (WHERE created), count(*) FILTER (WHERE NOT created), min(due) FROM ins

-- name: delete_archived
-- Delete archived rows, each only if it is still the finished version the
-- archive read: every writer of the queue columns bumps updated_at. The
-- DELETE re-checks a row updated concurrently against its new version.
DELETE FROM {table} AS t USING unnest(%s::bigint[], %s::text[], %s::bigint[], %s::bigint[], %s::bigint[])
    AS a(id, status, attempt_count, updated_us, finished_us)
WHERE t.id = a.id AND t.status = a.status AND t.status IN ('succeeded', 'failed', 'cancelled')
    AND t.attempt_count = a.attempt_count
    AND t.updated_at = 'epoch'::timestamptz + a.updated_us * interval '1 microsecond'
    AND t.finished_at = 'epoch'::timestamptz + a.finished_us * interval '1 microsecond'

-- name: count_ids
-- How many of some ids are still in the table (the rows an archive kept).
SELECT count(*) FROM {table} WHERE id = ANY(%s::bigint[])

-- name: create_group_clear
-- The claim's ordered-group condition for a grouped row (groups.group_clear):
-- no earlier message of its group still to run (or failed, where its queue
-- blocks on failure) and none of its group running under a live lease. As a
-- function its two probes are planned once per connection; as subqueries of
-- the claim they were planned on every claim (Django sends the claim as text),
-- about 0.5 ms each time. STABLE: it reads with the claim's own snapshot.
-- Each probe names the condition of delayq_group_idx in full, so that the
-- plan the server keeps (generic, for any arguments) reads that index.
CREATE OR REPLACE FUNCTION delayq_group_clear(
    row_queue varchar, row_group varchar, row_id bigint, at timestamptz, failed_blocks boolean
) RETURNS boolean LANGUAGE plpgsql STABLE AS $body$
BEGIN
    RETURN NOT EXISTS (
        SELECT 1 FROM {table} u0
        WHERE NOT (u0.{group} = '') AND u0.{queue} = row_queue AND u0.{group} = row_group
            AND u0.{id} < row_id AND u0.{status} IN ('pending', 'running', 'failed')
            AND (u0.{status} <> 'failed' OR failed_blocks)
    ) AND NOT EXISTS (
        SELECT 1 FROM {table} u0
        WHERE NOT (u0.{group} = '') AND u0.{queue} = row_queue AND u0.{group} = row_group
            AND u0.{status} = 'running' AND u0.{due} > at
    );
END
$body$

-- name: drop_group_clear
DROP FUNCTION IF EXISTS delayq_group_clear(varchar, varchar, bigint, timestamptz, boolean)

-- name: create_holder_gone
-- The claim's test of a running row whose lease passed (queries.claimable_condition):
-- its worker is gone, not live (its heartbeat's promise, alive_until, has passed,
-- or a worker of an older version has sent none for dead_after; stopped; or
-- unknown). As a function, planned once per connection, where the same test as a
-- subquery of the claim made every claim's planning take twice as long. STABLE:
-- it reads with the claim's own snapshot. It runs only for the running rows the
-- claim looks at: the OR before it decides for the others.
CREATE OR REPLACE FUNCTION delayq_holder_gone(
    holder varchar, at timestamptz, dead_after interval
) RETURNS boolean LANGUAGE plpgsql STABLE AS $body$
BEGIN
    RETURN NOT EXISTS (
        SELECT 1 FROM {workers} w
        WHERE w.{name} = holder AND w.{stopped_at} IS NULL
            AND (w.{alive_until} > at
                 OR (w.{alive_until} IS NULL AND w.{last_seen} > at - dead_after))
    );
END
$body$

-- name: drop_holder_gone
DROP FUNCTION IF EXISTS delayq_holder_gone(varchar, timestamptz, interval)

-- name: create_ended_function
-- The notification that ends a wait (store.ended): the channel names the message.
CREATE OR REPLACE FUNCTION delayq_ended_notify() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('django_delayq_ended_' || OLD.{id}, '');
    ELSE
        PERFORM pg_notify('django_delayq_ended_' || NEW.{id}, '');
    END IF;
    RETURN NULL;
END
$body$

-- name: create_ended_trigger
-- Only rows somebody waits for call the function: for every other row the
-- condition is one column test, and no event is queued (acks pay nothing).
CREATE TRIGGER delayq_ended AFTER UPDATE OF {status} ON {table} FOR EACH ROW
    WHEN (NEW.{waited} AND NEW.{status} IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION delayq_ended_notify()

-- name: create_deleted_trigger
CREATE TRIGGER delayq_ended_deleted AFTER DELETE ON {table} FOR EACH ROW
    WHEN (OLD.{waited}) EXECUTE FUNCTION delayq_ended_notify()

-- name: drop_ended_triggers
DROP TRIGGER IF EXISTS delayq_ended ON {table};
DROP TRIGGER IF EXISTS delayq_ended_deleted ON {table};
DROP FUNCTION IF EXISTS delayq_ended_notify()

-- name: mark_waited
-- Ask for the notification: skip a row another transaction holds (a wait must
-- never queue behind a producer's lock; it tries again at its next look).
-- One row back when the row is marked (now or before), none when it was held.
WITH r AS (SELECT {id}, {waited} FROM {table} WHERE {id} = %s FOR NO KEY UPDATE SKIP LOCKED),
m AS (UPDATE {table} t SET {waited} = true FROM r WHERE t.{id} = r.{id} AND NOT r.{waited})
SELECT 1 FROM r

-- name: end_edges
-- A workflow's edges whose parent has finished ({edges}: which ones, on the edge d
-- or its parent p; the parent's status is tested so that no plan reads every
-- finished message through delayq_finished_idx: a fan-in's 10,000 parents each
-- read all those finished before them, on statistics taken before any was),
-- ended, and their children's counts of parents changed, in one statement: the
-- change that leaves a waiting child no parent to wait for releases it, and one
-- that brings it a failed parent cancels it if its on_parent_failure says so.
-- Parents ending at once on several workers change a common child one after
-- the other (its row lock; PostgreSQL re-reads the row it waited for), so
-- exactly one of them sees the count reach 0. Returns the children released
-- or cancelled. The sweep passes the children another transaction holds
-- ({locked}: the CTE end_edges_locked, and {only_locked} the condition on the
-- edges): their edges stay open until a later round. A worker's statement, in
-- autocommit, waits for a child's lock at most {lock_wait}'s time: set for its
-- own transaction (the statement) before the first edge is read, it fails the
-- statement rather than wait on (no round trip of its own for the setting);
-- the worker then sends it again as the sweep's form, for its own edges.
-- {notes} is empty, or the CTE end_edges_notes (wake the idle workers of the
-- released ones' queues, at commit) and {noted} what makes it run. {parents}
-- is the message table, or the CTE end_edges_acked (the parent's outcome
-- written by this statement, whose rows follow the released ones: {also}).
WITH {locked}ended AS (
    UPDATE {dependency} d SET {parent_ended} = p.{status}
    FROM {parents} p
    WHERE p.{id} = d.{parent_id} AND d.{parent_ended} = ''
        AND p.{status} <> 'pending' AND p.{status} <> 'running' AND ({edges}){only_locked}{lock_wait}
    RETURNING d.{child_id} AS child, d.{position} AS place, p.{status} AS status,
        'Cancelled: parent ' || p.{queue} || '/' || p.{key} || ' (#' || p.{id}
            || ') ended ' || p.{status} AS why
), tally AS (
    SELECT child, count(*) AS n, count(*) FILTER (WHERE status <> 'succeeded') AS f,
        (array_agg(why ORDER BY place) FILTER (WHERE status <> 'succeeded'))[1] AS why
    FROM ended GROUP BY child
), changed AS (
    UPDATE {message} c SET
        {parents_waiting} = c.{parents_waiting} - t.n,
        {parents_failed} = c.{parents_failed} + t.f,
        {status} = CASE WHEN c.{policy} = 'cancel' AND c.{parents_failed} + t.f > 0
            THEN 'cancelled' ELSE c.{status} END,
        {finished_at} = CASE WHEN c.{policy} = 'cancel' AND c.{parents_failed} + t.f > 0
            THEN {now} ELSE c.{finished_at} END,
        {last_error} = CASE WHEN c.{policy} = 'cancel' AND c.{parents_failed} + t.f > 0
            THEN coalesce(t.why, 'Cancelled: a parent failed') ELSE c.{last_error} END,
        {due} = CASE
            WHEN c.{parents_waiting} - t.n = 0
                AND (c.{parents_failed} + t.f = 0 OR c.{policy} = 'run')
            THEN greatest(c.{scheduled_time}, {now}) END,
        {updated_at} = {now}
    FROM tally t
    WHERE c.{id} = t.child AND c.{status} = 'pending' AND c.{due} IS NULL
        AND c.{policy} <> ''
    RETURNING c.{id}, c.{queue}, c.{group}, c.{status}, c.{due} IS NOT NULL AS released,
        c.{due} AS due
){notes}
SELECT {id}, {queue}, {group}, {status}, released{noted} FROM changed
WHERE released OR {status} = 'cancelled'{also}

-- name: end_edges_locked
-- end_edges' children (of the sweep, or of a worker's call whose wait for a
-- child's lock timed out: {edges}), locked first, passing those another
-- transaction holds (a producer's upsert of a step's key in a long transaction).
kids AS MATERIALIZED (
    SELECT c.{id} FROM {message} c
    WHERE c.{id} IN (
        SELECT d.{child_id} FROM {dependency} d JOIN {message} p ON p.{id} = d.{parent_id}
        WHERE d.{parent_ended} = '' AND p.{status} <> 'pending' AND p.{status} <> 'running'
            AND ({edges}))
    ORDER BY c.{id} FOR NO KEY UPDATE SKIP LOCKED
), 

-- name: end_edges_notes
-- end_edges' wake-up: one NOTIFY per queue of released children, with the
-- earliest due time (the body store/wakeup.py's notify sends).
, notes AS (
    SELECT pg_notify(%s, json_build_object(
        'queue', {queue}, 'due', extract(epoch FROM min(due)))::text)
    FROM changed WHERE released GROUP BY {queue}
)

-- name: end_edges_only_locked
-- end_edges' edges when it locks their children first (end_edges_locked): those
-- of the children it locked, or of none left.
 AND (d.{child_id} IN (SELECT {id} FROM kids)
    OR NOT EXISTS (SELECT 1 FROM {message} x WHERE x.{id} = d.{child_id}))

-- name: end_edges_lock_wait
-- end_edges' bound on a worker's wait for a child's row lock (see end_edges).
 AND (SELECT set_config('lock_timeout', '{ms}ms', true)) IS NOT NULL

-- name: end_edges_async_commit
-- A worker's end_edges after its parent's outcome committed: its commit does
-- not wait for the write-ahead log to reach the disk (the claim's way, for
-- its own transaction only). What a server crash can lose is the release
-- alone, which the sweep makes again from the parent's outcome (committed
-- before it, synchronously), and the log is flushed in order, so a released
-- step's own outcome flushes its release first. A chain's step waited for
-- two flushes (its parent's outcome, then the release); now for one.
 AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL

-- name: end_edges_acked
-- end_edges with the parent's outcome in the same statement (a worker's
-- acknowledgement of a parent it ran alone): {outcome} is the outcome's
-- UPDATE with its compare-and-set, returning the parent's columns end_edges
-- reads. One round trip and one commit per step of a chain instead of two;
-- the release commits exactly when the outcome does.
acked AS (
    {outcome} RETURNING {id}, {queue}, {key}, {status}
), 

-- name: end_edges_acked_rows
-- end_edges_acked's parents, after the released children (their status is
-- 'succeeded', which no released or cancelled child has).
 UNION ALL SELECT {id}, NULL, NULL, {status}, false{noted} FROM acked
