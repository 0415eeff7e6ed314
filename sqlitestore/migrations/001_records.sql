-- Idempotency records. Times are Unix nanoseconds from the core's clock.
-- state: 1 = in flight (owned by token under a lease), 2 = completed.
CREATE TABLE IF NOT EXISTS {{table}} (
	scope       TEXT    NOT NULL,
	key         TEXT    NOT NULL,
	fingerprint TEXT    NOT NULL,
	state       INTEGER NOT NULL CHECK (state IN (1, 2)),
	token       TEXT,
	lease_until INTEGER NOT NULL,
	expires_at  INTEGER NOT NULL,
	response    BLOB,
	PRIMARY KEY (scope, key)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS {{table}}_expires_at ON {{table}} (expires_at);
