-- Version 3: one index over every record in flight, ordered by the end of
-- its lease. It serves Stuck (the records suspended after a step are the
-- in-flight ones holding a checkpoint whose lease ended) and the operator
-- console's in-flight counts, its oldest lease and its in-flight listing,
-- which without it read every row of the table (13 s on 1M records). It
-- replaces the narrower stuck index, so that claims, renewals and
-- completions maintain as many indexes as before.
CREATE INDEX IF NOT EXISTS {{table}}_inflight ON {{table}} (lease_until) WHERE state = 1;
DROP INDEX IF EXISTS {{table}}_stuck;
