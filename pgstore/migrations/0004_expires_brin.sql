-- Version 4: the expiry index becomes a BRIN index.
--
-- expires_at grows with the time a record was claimed, and rows are
-- appended in about that order, so a block-range index finds the expired
-- rows while costing a claim almost nothing: a new row lands in a range
-- that is not summarised yet, which writes no index entry and no WAL. The
-- B-tree it replaces took one entry per claim on its rightmost page, which
-- every concurrent claim contended for. DeleteExpired reads the ranges
-- whose summary says they may hold expired rows; autosummarize asks
-- autovacuum to summarise each range once it fills.
CREATE INDEX IF NOT EXISTS {expires_brin_index} ON {table} USING brin (expires_at)
    WITH (pages_per_range = 16, autosummarize = on);
DROP INDEX IF EXISTS {schema}.{expires_index};
