-- Version 2: completions and renewals leave the secondary indexes alone.
--
-- InnoDB rewrites a secondary index entry (marks the old one deleted and
-- inserts a new one, with its undo and redo) whenever an UPDATE changes a
-- column of that index. Version 1's index on lease_expires_at changed on
-- every completion (which clears the lease) and every renewal. stuck_lease
-- is the lease end of a record holding a recovery point, NULL for every
-- other record: completing or renewing a record without one leaves it
-- NULL, so its index entry stays as it is. Stuck reads that index in
-- lease order; it lists exactly the records Stuck may return (a recovery
-- point, in flight until completion clears it). The column is virtual:
-- adding it writes no row, and the index stores its values.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS stuck_lease DATETIME(6)
    AS (IF(checkpoint IS NULL, NULL, lease_expires_at)) VIRTUAL;
CREATE INDEX IF NOT EXISTS {stuck_index} ON {table} (stuck_lease);
DROP INDEX IF EXISTS {lease_index} ON {table};
