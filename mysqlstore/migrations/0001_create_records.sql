-- Version 1: the records table.
--
-- Rules for every migration file: each statement is idempotent (IF NOT
-- EXISTS, ADD COLUMN IF NOT EXISTS, ...), because MariaDB commits every DDL
-- statement on its own and a migration interrupted half-way runs again;
-- statements end with a semicolon at the end of a line; {table} and the
-- {..._index} names are replaced by quoted identifiers. Never edit a
-- released file: add the next version instead.

-- One row per (scope, key). A record is in flight while token is set (then
-- lease_expires_at is set and response is NULL) and completed once response
-- is set (then token and lease_expires_at are NULL).
--
-- scope and key are VARBINARY: compared and ordered as bytes, never by a
-- case-insensitive collation ("K" and "k" are two keys). Times are UTC,
-- written only from UTC_TIMESTAMP(6), the database's clock, so the session
-- time zone plays no part. fence is AUTO_INCREMENT: every insert draws a
-- new one, and a take-over re-inserts the row to draw its own; InnoDB
-- never hands out a value twice and keeps the counter across restarts.
-- rev grows with every write by the owner, so that an UPDATE always changes
-- the row it matches: MariaDB reports changed rows, not matched ones,
-- unless the client sets CLIENT_FOUND_ROWS.
CREATE TABLE IF NOT EXISTS {table} (
    scope            VARBINARY(2048) NOT NULL,
    `key`            VARBINARY(1024) NOT NULL,
    fingerprint      VARBINARY(255)  NOT NULL,
    token            VARBINARY(255)  NULL,
    lease_expires_at DATETIME(6)     NULL,
    expires_at       DATETIME(6)     NOT NULL,
    attempt          INT             NOT NULL DEFAULT 1,
    fence            BIGINT          NOT NULL AUTO_INCREMENT,
    rev              BIGINT          NOT NULL DEFAULT 0,
    response         LONGBLOB        NULL,
    checkpoint       LONGBLOB        NULL,
    PRIMARY KEY (scope, `key`),
    UNIQUE KEY {fence_index} (fence),
    KEY {expires_index} (expires_at),
    KEY {lease_index} (lease_expires_at),
    CONSTRAINT {state_check} CHECK ((token IS NULL) = (response IS NOT NULL)),
    CONSTRAINT {lease_check} CHECK ((token IS NULL) = (lease_expires_at IS NULL))
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;
