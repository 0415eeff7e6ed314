-- Version 3: one index over every record in flight, in the order of the
-- end of its lease (then scope and key, for paging). It serves Stuck (the
-- suspended records are the in-flight ones holding a checkpoint whose lease
-- ended) and the operator console's in-flight counts, its oldest lease and
-- its in-flight listing, which without it read the whole table. It
-- replaces the narrower stuck index: claims, renewals and completions
-- maintain as many indexes as before, and completions were already not
-- heap-only updates (token and lease_expires_at, which completion clears,
-- were indexed by the stuck index too).
CREATE INDEX IF NOT EXISTS {inflight_index} ON {table} (lease_expires_at, scope, key)
    WHERE token IS NOT NULL;
DROP INDEX IF EXISTS {schema}.{stuck_index};
