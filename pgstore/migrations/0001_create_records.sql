-- Version 1: the records table and its expiry index.
--
-- Rules for every migration file (New may run them from several instances
-- at once, and on databases where DDL is not transactional or advisory locks
-- are no-ops): each statement is idempotent (IF NOT EXISTS, ADD COLUMN IF
-- NOT EXISTS, ...), statements are separated by a semicolon at the end of a
-- line, and {schema}, {table} and {expires_index} are replaced by quoted
-- identifiers. Never edit a released file: add the next version instead.

-- One row per (scope, key). A record is in flight while token is set (then
-- lease_expires_at is set and response is NULL) and completed once response
-- is set (then token and lease_expires_at are NULL); the CHECK keeps the two
-- states apart. attempt counts the claims of one retention period, so that a
-- claim can tell a take-over (attempt > 1) from a fresh insert without
-- reading the old row version. The fill factor leaves room on every page
-- for Complete's new row version, so that it can be a heap-only update that
-- touches no index (CockroachDB and YugabyteDB accept and ignore it).
CREATE TABLE IF NOT EXISTS {table} (
    scope            text        NOT NULL,
    key              text        NOT NULL,
    fingerprint      text        NOT NULL,
    token            text,
    lease_expires_at timestamptz,
    expires_at       timestamptz NOT NULL,
    attempt          integer     NOT NULL DEFAULT 1,
    response         bytea,
    PRIMARY KEY (scope, key),
    CHECK ((token IS NULL) = (response IS NOT NULL)),
    CHECK ((token IS NULL) = (lease_expires_at IS NULL))
) WITH (fillfactor = 80);

-- DeleteExpired walks this index in expiry order.
CREATE INDEX IF NOT EXISTS {expires_index} ON {table} (expires_at);
