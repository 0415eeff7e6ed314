-- Version 5: completions become heap-only (HOT) updates.
--
-- PostgreSQL makes an UPDATE heap-only, writing no index entry, only if no
-- column that an index uses changes: its key columns, its expressions and
-- the columns of a partial index's predicate (BRIN indexes too, before
-- PostgreSQL 16). The in-flight index of version 3 used lease_expires_at
-- and token, which every completion clears, so no completion was HOT:
-- each wrote a new primary-key entry and a new in-flight entry, and each
-- claim an in-flight entry. Per first execution that was 6 WAL records
-- besides the two commits; with this index it is 4, as for a table with a
-- primary key only (pgstore/BENCHMARKS.md).
--
-- The index below serves Stuck (the reconciler) and the console's
-- suspended and held listings: the records holding a recovery point,
-- nearly all of them in flight (completion clears it). Its columns and
-- its predicate are ones that the completion of a record without a
-- recovery point leaves as they were (checkpoint stays NULL), and that a
-- lease renewal never touches, so both are heap-only updates. Saving a
-- recovery point, ending or holding a lease, and completing a record that
-- holds one are not. Stuck reads every entry of this index and sorts them
-- by lease end: the records with a recovery point, never the table.
--
-- The console's in-flight listing, its in-flight counts and its oldest
-- lease read the table instead (docs/console.md names the index an
-- operator may add for them, at the price of heap-only completions).
-- Building the index reads the whole table under a lock that blocks
-- writes for that time.
CREATE INDEX IF NOT EXISTS {checkpoint_index} ON {table} (scope, key)
    WHERE checkpoint IS NOT NULL;
DROP INDEX IF EXISTS {schema}.{inflight_index};
